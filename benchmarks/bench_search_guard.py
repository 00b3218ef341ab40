"""The factor search's perplexity guard at each target, as `hf-posenc extend` plans it: how much each closed-form
seed, and points drawn evenly from the searched space, raise perplexity inside the original context, and how many
of them the guard lets through, at 8 % and at the plan's share.

In the pipeline's static mode a candidate's factors apply at every length, so its cost inside the original context
grows with s = target / original; a guard fixed at one share rejects more as s grows. Each target's cell: the
unpatched model's guard perplexity (the search's own guard: its first `guard_length` tokens of the tuning text),
every seed's rise over it, and the rises of --points points of the space (uniform in [0, 1]^k, seed 0: the same
points at every target, each the same shape in multiples of s). Guard passes only: seconds each, no long pass.

    OMP_NUM_THREADS=2 nice python benchmarks/bench_search_guard.py --targets 32768 65536 \\
        --out benchmarks/results/search_guard.json
"""

from __future__ import annotations

import argparse
import tempfile

import numpy as np
import torch

import common
from hf_posenc import api, corpora
from hf_posenc.recipes import extend
from hf_posenc.search import FactorSearch
from hf_posenc.search.factors import SEED_NAMES, closed_forms, longrope_params

SHARES = (0.08,)   # the shipped 4x search's guard, beside each plan's own


def rise(runner: FactorSearch, reference: float, factors, attention, mode: str, target: int) -> float:
    with api.patched(runner.model, "longrope", **longrope_params(factors, attention, mode, target)):
        return runner.guard_perplexity() / reference - 1


def measure(model, tokenizer, target: int, points: int) -> dict:
    args = extend.parse_args(["--model", "smollm2", "--target", str(target), "--output_dir", "unused"])
    plan = extend.make_plan(args, extend.model_facts(args), extend.machine_kind("float32"))
    s = extend.search_settings(plan)
    prefix = corpora.bos_prefix(tokenizer, "auto")
    ids = common.corpus_ids(tokenizer, s.corpus)
    with tempfile.TemporaryDirectory() as out:   # the search's guard and space; nothing is written
        runner = FactorSearch(model, tokenizer, ids, s, out, prefix=prefix, progress=False)
    reference = runner.guard_perplexity()
    low, high = runner.space.attention_range
    seeds = {SEED_NAMES[name]: rise(runner, reference, f, float(np.clip(a, low, high)), s.mode, target)
             for name, f, a in closed_forms(model, target)}
    rng = np.random.default_rng(0)
    drawn = [rise(runner, reference, *runner.space.point(rng.uniform(size=runner.space.dims)), s.mode, target)
             for _ in range(points)]
    return {"plan_share": s.guard_share, "reference": reference, "seeds": seeds, "points": drawn}


def report(target: int, cell: dict) -> None:
    shares = sorted({*SHARES, cell["plan_share"]})
    seeds = ", ".join(f"{k} {v:+.1%}" for k, v in cell["seeds"].items())
    print(f"{target} (s = {target / 8192:g}): guard perplexity {cell['reference']:.3f} unpatched; seeds {seeds}")
    points = np.array(cell["points"])
    print(f"  {len(points)} points of the space: rise median {np.median(points):+.1%} (quartiles "
          f"{np.quantile(points, 0.25):+.1%}, {np.quantile(points, 0.75):+.1%})")
    for share in shares:
        passed = [k for k, v in cell["seeds"].items() if v <= share]
        print(f"  at {share:.0%}{' (the plan)' if share == cell['plan_share'] else ''}: seeds through "
              f"{', '.join(passed) or 'none'}; points through {int((points <= share).sum())} of {len(points)}")


def main() -> None:
    parser = common.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--targets", type=common.count(8193), nargs="+", default=[32768, 65536])
    parser.add_argument("--points", type=common.count(1), default=20, help="points drawn from the space a target")
    parser.add_argument("--out", required=True, help="results file (.json): each target saved as it completes")
    args = parser.parse_args()
    results, save = common.results_file(args.out, {"model": "smollm2", "points": args.points}, ["cells"])
    print(common.machine(), flush=True)
    model, tokenizer = common.smollm2("float32")
    with torch.inference_mode():
        for target in args.targets:
            if str(target) not in results["cells"]:
                results["cells"][str(target)] = measure(model, tokenizer, target, args.points)
                save()
            report(target, results["cells"][str(target)])


if __name__ == "__main__":
    common.run(main)
