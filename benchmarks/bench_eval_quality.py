"""Quality of the RoPE methods at twice SmolLM2-135M's context, no fine-tuning: per-document perplexity at
several context lengths on several Shakespeare plays, and passkey accuracy.

Perplexity at length n: the play truncated to its first n tokens, scored in one pass (a sliding window
of n tokens over n tokens), `hpe.perplexity_by_length`: for a static method (and the unpatched model)
one pass over the longest length gives every n at once (benchmarks/bench_eval_onepass.py times it and
checks that it is the same number); a length-dependent method (dynamic, dynamic_yarn) picks its
frequencies from the input length, so each n is its own pass.

recipes/evaluate.py measures the same with `eval.perplexity_lengths`; this script adds the per-play tables,
the distance from the unpatched model at its context, and a panel per play (tables and figure drawn by
hf_posenc.eval.report and hf_posenc.eval.plots, as the recipe's).

Passkey: `hpe.make_trials("passkey", ...)`, one teacher-forced pass per trial (right when greedy decoding
gives the key). A length-dependent method at a length within the original context is the unpatched
model exactly (tests/test_eval.py); --reuse-inside takes the unpatched model's scores there.

Results go to --out (JSON, rewritten after every step: a rerun with the same settings resumes), the
tables to stdout, the figure to --plot.

    python benchmarks/bench_eval_quality.py                       # ~1 h on 2 CPU cores
    python benchmarks/bench_eval_quality.py --lengths 512 1024 --passkey-lengths 1024 --out /tmp/q.json --plot /tmp/q.png
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

import common

from hf_posenc import eval as hpe
from hf_posenc.eval import report

METHODS = ["none", "linear", "ntk", "dynamic", "yarn", "dynamic_yarn"]


def perplexities(model, ids: list[int], lengths: list[int]) -> tuple[dict, str]:
    """{length: perplexity of the first `length` tokens}; how ("one pass" or "separate")."""
    res = hpe.perplexity_by_length(model, [ids], lengths, progress=False)
    return {str(n): p for n, p in zip(res["lengths"], res["perplexity"])}, "one pass" if res["one_pass"] else "separate"


def main() -> None:
    parser = common.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--plays", nargs="+", default=["hamlet", "richard_iii"])
    parser.add_argument("--methods", nargs="+", default=METHODS)
    parser.add_argument("--lengths", type=common.count(2), nargs="+", default=[2048, 4096, 8192, 16384])
    parser.add_argument("--target", type=common.count(0), default=0, help="patch target (0: twice the model's context)")
    parser.add_argument("--passkey-lengths", type=common.count(1), nargs="*", default=[4096, 8192, 16384])
    parser.add_argument("--depths", type=float, nargs="+", default=[0.1, 0.3, 0.5, 0.7, 0.9])
    parser.add_argument("--trials", type=common.count(1), default=1, help="passkey trials per (length, depth)")
    parser.add_argument("--reuse-inside", action=argparse.BooleanOptionalAction, default=True,
                        help="length-dependent methods take the unpatched scores at lengths <= the context")
    parser.add_argument("--dtype", default="bfloat16", choices=common.DTYPES)
    parser.add_argument("--out", default="runs/bench/eval_quality.json")
    parser.add_argument("--plot", default="docs/eval_smollm2_quality.png")
    args = parser.parse_args()

    model, tokenizer = common.smollm2(args.dtype)
    context = model.config.max_position_embeddings
    target = args.target or 2 * context
    lengths = sorted(args.lengths)
    docs = common.plays(tokenizer, args.plays, lengths[-1])
    trials = hpe.make_trials("passkey", tokenizer, lengths=args.passkey_lengths, depths=args.depths,
                             trials=args.trials, seed=0) if args.passkey_lengths else []

    settings = {k: v for k, v in vars(args).items() if k not in ("out", "plot")} | {"target": target}
    results, save = common.results_file(args.out, settings, ["perplexity", "passkey"])
    results["machine"] = f"{common.machine()}, SmolLM2-135M {args.dtype} sdpa"
    print(results["machine"], f"; target {target} (context {context})", flush=True)

    for method in args.methods:
        with hpe.variant(model, method, target):
            dynamic = hpe.is_length_dependent(model)
            for play, ids in docs.items():
                if play in results["perplexity"].get(method, {}):
                    continue
                (ppl, how), wall, cpu = common.timed(lambda: perplexities(model, ids, lengths))
                results["perplexity"].setdefault(method, {})[play] = {"ppl": ppl, "how": how, "seconds": wall, "cpu": cpu}
                save()
                print(f"{method} {play} ({how}, {wall:.0f} s): "
                      + ", ".join(f"{n} {p:.2f}" for n, p in ppl.items()), flush=True)
            if trials and method not in results["passkey"]:
                start = time.perf_counter()
                reuse = args.reuse_inside and dynamic and "none" in results["passkey"]
                scores, reused = [], 0
                for i, trial in enumerate(trials):
                    if reuse and trial.length <= context:
                        scores.append(results["passkey"]["none"]["scores"][i])
                        reused += 1
                    else:
                        scores += hpe.score_trials(model, [trial], progress=False)
                summary = hpe.summarize(trials, scores)
                results["passkey"][method] = {**summary, "scores": scores, "reused_from_none": reused,
                                              "seconds": time.perf_counter() - start}
                save()
                print(f"{method} passkey ({time.perf_counter() - start:.0f} s, {reused} trials reused): "
                      + ", ".join(f"{n} {a:.2f}" for n, a in zip(summary["lengths"], summary["by_length"])), flush=True)

    print()
    print(tables(results, args.methods, args.plays, lengths, context))
    if args.plot:
        print(f"figure: {plot(results, args.methods, args.plays, lengths, context, args.plot)}")


def mean_ppl(per_play: dict, plays: list[str], n: int) -> float:
    """Perplexity over the plays' tokens together (same count per play: the geometric mean)."""
    return math.exp(sum(math.log(per_play[p]["ppl"][str(n)]) for p in plays) / len(plays))


def by_length(per_play: dict[str, dict], plays: list[str], lengths: list[int]) -> dict[str, dict]:
    """{panel: {method: perplexity_by_length-shaped results}}, one panel per play and one for their geometric mean."""
    panels = {}
    for play in plays + ["mean"]:
        panels[play] = {m: {"lengths": lengths, "one_pass": r[plays[0]]["how"] == "one pass",
                            "perplexity": [mean_ppl(r, plays, n) if play == "mean" else r[play]["ppl"][str(n)]
                                           for n in lengths]}
                        for m, r in per_play.items()}
    return panels


def tables(results: dict, methods: list[str], plays: list[str], lengths: list[int], context: int) -> str:
    ppl = {m: results["perplexity"][m] for m in methods
           if m in results["perplexity"] and all(p in results["perplexity"][m] for p in plays)}
    lines = []
    for play, rows in by_length(ppl, plays, lengths).items():
        lines += [f"Perplexity of the first n tokens, {play if play != 'mean' else 'all plays (geometric mean)'}:", "",
                  *report.length_table(rows, digits=lambda v: f"{v:.2f}", label="method"), ""]
    longest = lengths[-1]
    if "none" in ppl and context in lengths:
        def cell(m, play, n):
            return mean_ppl(ppl[m], plays, n) if play == "mean" else ppl[m][play]["ppl"][str(n)]

        lines += [f"Distance of each method's {longest} perplexity from the unpatched model's {context} perplexity "
                  f"(ratio, difference):", "",
                  *report.table(["method", *plays, "mean"],
                                ([m, *(f"{cell(m, p, longest) / cell('none', p, context):.3f}x, "
                                       f"{cell(m, p, longest) - cell('none', p, context):+.2f}" for p in plays + ["mean"])]
                                 for m in ppl)), ""]
    runs = {m: results["passkey"][m] for m in methods if m in results["passkey"]}
    if runs:
        first = next(iter(runs.values()))
        lines += [f"Passkey accuracy ({first['trials'] // len(first['lengths'])} trials per length: depths "
                  f"{first['depths']}, seed 0):", "", *report.retrieval_table(runs, label="method"), ""]
    return "\n".join(lines)


def plot(results: dict, methods: list[str], plays: list[str], lengths: list[int], context: int, path: str) -> Path:
    from hf_posenc.eval import plots

    ppl = {m: results["perplexity"][m] for m in methods
           if m in results["perplexity"] and all(p in results["perplexity"][m] for p in plays)}
    panels = {("all plays (geometric mean)" if play == "mean" else play): rows
              for play, rows in by_length(ppl, plays, lengths).items()}
    return plots.plot_perplexity_by_length_panels(
        panels, path, original_context=context,
        title=f"SmolLM2-135M, RoPE methods at {results['settings']['target']} tokens, no fine-tuning")


if __name__ == "__main__":
    common.run(main)
