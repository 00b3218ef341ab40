"""The factor search judged (issue 38): SmolLM2-135M (8k native) at --target tokens, the searched longrope checkpoint
(`hf-posenc search`, hf_posenc/search/) against YaRN, the ramp `longrope`, Self-Extend, DCA and the unpatched
model, on texts the search never saw (it tuned on the plays; these are books of the King James Bible).

Cells, each saved as it completes (--out; a rerun goes on where the last stopped):
- `ppl`: the perplexity of the first L tokens of each text, one pass a length (a switched longrope config uses its
  short set in a pass inside the original context and its long set past it, so the lengths are not one pass);
- `passkey` (--passkey-trials N): N passkeys hidden at N depths of a --target prompt, each trial's answer log-prob.
Recall at a distance is benchmarks/bench_recall.py's (the same rows, its paired differences).

`--transfer SEARCH_DIR OUT`: the best point of a finished search (its form's coordinates) taken to --target (the
same critical pair, width, shape and attention factor; the top factor the same multiple of the new s) and saved as
a checkpoint in OUT, for a row NAME=OUT here and in bench_recall.py: a search at 16k carried to 32k. Every line of
its candidates.jsonl must carry the identity of the search in its search.json; `--unmarked-candidates` takes lines
written before candidates carried one (benchmarks/results/search_32k_*) as that search's.

Rows: `none` (unpatched), a method patched to --target (`yarn`, `longrope`: the ramp, `self_extend`, `dca`, ...),
NAME=FOLDER (a saved checkpoint, hp.from_pretrained), or NAME=FOLDER@static (a saved switched longrope checkpoint
loaded with its short factors = its long ones: the static twin, as engines run it past the original context).

    nice python benchmarks/bench_search.py --rows none yarn searched=runs/search_16k/best \\
        searched_static=runs/search_16k/best@static --target 16384
    python benchmarks/bench_search.py --transfer runs/search_16k runs/search_16k_to_32k --target 32768
    python benchmarks/bench_search.py --report
"""

from __future__ import annotations

import argparse
import math
import time

import torch

import common
import hf_posenc as hp
from hf_posenc import eval as hpe
from hf_posenc.eval import stats
from hf_posenc.eval.perplexity import token_nll

ORIGINAL = 8192   # SmolLM2-135M's own context
TEXTS = ["kjv:genesis", "kjv:isaiah"]


def static_twin(model):
    """A model patched with a switched longrope config, patched again with its short factors = its long ones."""
    params = dict(model.config.get_text_config().rope_parameters)
    if params.get("rope_type") != "longrope":
        common.refuse(f"@static takes a longrope checkpoint; this one has rope_type {params.get('rope_type')!r}")
    hp.unpatch(model)
    return hp.patch(model, "longrope", long_factor=params["long_factor"], short_factor=params["long_factor"],
                    attention_factor=params.get("attention_factor"),
                    max_position_embeddings=round(params["factor"] * params["original_max_position_embeddings"]))


def transfer(folder: str, out: str, target: int, unmarked: bool = False) -> None:
    """Save the best CMA-ES point of the search in `folder`, taken to `target`, as a checkpoint in `out`; `unmarked`:
    candidates with no identity are taken as the search's of its search.json (search.read_candidates)."""
    import json
    from pathlib import Path

    from hf_posenc import search
    from hf_posenc import user_input

    out = user_input.output_folder(out, "--transfer OUT", [folder], replaces=True)   # before anything loads
    path = Path(folder) / "search.json"
    if not path.is_file():
        common.refuse(f"--transfer {folder}: no search.json there (the folder of a factor search: hf-posenc search)")
    try:
        record = json.loads(path.read_text())
        settings = dict(record["settings"])
    except (ValueError, KeyError, TypeError):
        common.refuse(f"--transfer {path} is not a search's record (not JSON, or no settings)")
    candidates = Path(folder) / "candidates.jsonl"
    if not unmarked and any("identity" not in r for r in search.read_candidates(candidates)):
        common.refuse(f"--transfer {candidates} holds candidates with no identity of the search that scored them "
                      f"(written before candidates carried one): give --unmarked-candidates to take them as the "
                      f"search's of {path}")
    rows = [r for r in search.read_candidates(candidates, record, unmarked=unmarked)
            if not r["rejected"] and r.get("x")]
    if not rows:
        common.refuse(f"--transfer {folder}: no accepted CMA-ES candidate to carry (a seed is its own method)")
    best = min(rows, key=lambda r: r["value"])
    s = search.SearchSettings(**{**settings, "target": target})   # a target <= the original refused here
    factors, attention = s.space(record["pairs"]).point(best["x"])
    model = hp.load_model(settings["model"])   # the model the search scored, not a default
    hp.patch(model, "longrope", **search.longrope_params(factors, attention, s.mode, target))
    with user_input.replacing(out) as fresh:
        model.save_pretrained(fresh)
    print(f"{best['kind']} of {folder} at {target}: long_factor {factors}, attention {attention}; saved to {out}")


def load_row(row: str, target: int, dtype: torch.dtype):
    name, _, folder = row.partition("=")
    if folder:
        path, _, twin = folder.partition("@")
        model = hp.from_pretrained(path, dtype=dtype, attn_implementation="sdpa")
        if twin:
            model = static_twin(model)
        return model.to(common.DEVICE).eval()
    model = hp.load_model("smollm2", dtype=dtype, attn_implementation="sdpa").to(common.DEVICE).eval()
    if name != "none":
        hp.patch(model, name, **hpe.variant_params(model, name, {}, target))
    return model


def check_rows(rows: list[str]) -> None:
    """Refused before anything loads: a row that names no method and no saved model, two rows of one name."""
    from hf_posenc.errors import ModelNotFoundError, UnknownMethodError
    from hf_posenc.loading import resolve
    from hf_posenc.registry import get_method

    names = [row.partition("=")[0] for row in rows]
    for row, name in zip(rows, names):
        path, _, twin = row.partition("=")[2].partition("@")
        if not name or twin not in ("", "static"):
            common.refuse(f"row {row!r}: a row is a method (none, yarn, ...), NAME=FOLDER or NAME=FOLDER@static")
        try:
            resolve(path) if path else (get_method(name) if name != "none" else None)
        except (ModelNotFoundError, UnknownMethodError) as err:
            common.refuse(f"row {row!r}: {err}")
    if len(set(names)) < len(names):
        common.refuse(f"two rows share a name ({' '.join(rows)}): a cell is kept by its row's name")


@torch.inference_mode()
def perplexity(model, ids: list[int]) -> float:
    nll = token_nll(model, torch.tensor([ids], device=common.DEVICE))
    return math.exp(nll.double().mean().item())


def passkey_cell(model, tokenizer, length: int, trials: int, depths: list[float] | None = None) -> dict:
    depths = depths or [(i + 0.5) / trials for i in range(trials)]
    made = hpe.make_trials("passkey", tokenizer, lengths=[length], depths=depths, trials=1, seed=0)
    scored = hpe.score_trials(model, made)
    logprobs = [t["logprob"] for t in scored]
    return {"found": sum(bool(t["correct"]) for t in scored), "n": len(scored),
            "answer_logprob": stats.bootstrap_mean(logprobs), "logprobs": logprobs}


def main() -> None:
    parser = common.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", nargs="+", default=["none", "yarn", "longrope"])
    parser.add_argument("--target", type=common.count(2), default=16384,
                        help="the context the methods are patched to (> 8192; --transfer: > the searched model's)")
    parser.add_argument("--lengths", type=common.count(2), nargs="+", default=[2048, 8192, 16384])
    parser.add_argument("--texts", nargs="+", default=TEXTS, help="held-out texts (load_corpus specs)")
    parser.add_argument("--passkey-trials", type=common.count(0, 100), default=0,
                        help="passkey trials at --target (0: none)")
    parser.add_argument("--passkey-depths", type=float, nargs="+", metavar="D",
                        help="where the trials hide the key, shares of the prompt in (0, 1), one trial each (default: "
                             "--passkey-trials evenly spread; 0.04 .. 0.24 put it 24-31k back at 32k)")
    parser.add_argument("--dtype", default=None, choices=common.DTYPES)
    parser.add_argument("--out", default="benchmarks/results/search_judge.json")
    parser.add_argument("--report", action="store_true", help="print the tables of --out")
    parser.add_argument("--transfer", nargs=2, metavar=("SEARCH_DIR", "OUT"),
                        help="save a finished search's best point taken to --target as a checkpoint, and stop")
    parser.add_argument("--unmarked-candidates", action="store_true",
                        help="--transfer: take candidates written before they carried their search's identity "
                             "(benchmarks/results/search_32k_*) as the search's of SEARCH_DIR/search.json")
    args = parser.parse_args()
    if args.transfer:
        return transfer(*args.transfer, args.target, args.unmarked_candidates)
    if any(n > args.target for n in args.lengths):
        common.refuse(f"--lengths must stay within --target {args.target}, got {args.lengths}")
    if args.target <= ORIGINAL:
        common.refuse(f"--target must be > SmolLM2's context {ORIGINAL}, got {args.target}")
    args.dtype = common.dtype_name(args.dtype)
    results, save = common.results_file(args.out, {"target": args.target, "dtype": args.dtype},
                                        ["ppl", "passkey"])
    if args.report:
        return report(results)
    check_rows(args.rows)
    results.setdefault("machine", f"{common.machine()}, SmolLM2-135M {args.dtype} sdpa, "
                                  f"{torch.get_num_threads()} thread(s)")
    depths = args.passkey_depths
    if depths and not all(0 < d < 1 for d in depths):
        common.refuse(f"--passkey-depths {' '.join(map(str, depths))}: each must be in (0, 1)")
    trials = len(depths) if depths else args.passkey_trials
    tokenizer = hp.load_tokenizer("smollm2")
    texts = {spec: common.corpus_ids(tokenizer, spec)[:max(args.lengths)] for spec in args.texts}
    for spec, ids in texts.items():
        if len(ids) < max(args.lengths):
            common.refuse(f"--texts {spec} has {len(ids)} tokens, fewer than {max(args.lengths)}")
    dtype = getattr(torch, args.dtype)
    for row in args.rows:
        name = row.partition("=")[0]
        todo = [(spec, n) for spec in texts for n in args.lengths if f"{name} {spec} {n}" not in results["ppl"]]
        key = f"{name} {args.target}" + (f" depths {' '.join(map(str, depths))}" if depths else "")
        need_passkey = trials and key not in results["passkey"]
        if not todo and not need_passkey:
            continue
        model = load_row(row, args.target, dtype)
        for spec, n in todo:
            start = time.perf_counter()
            value = perplexity(model, texts[spec][:n])
            results["ppl"][f"{name} {spec} {n}"] = {"ppl": value, "wall_s": time.perf_counter() - start}
            save()
            print(f"{name} {spec} {n}: {value:.3f}", flush=True)
        if need_passkey:
            results["passkey"][key] = passkey_cell(model, tokenizer, args.target, trials, depths)
            save()
            print(f"{key} passkey: {results['passkey'][key]}", flush=True)
    report(results)


def report(results: dict) -> None:
    print(results.get("machine", ""))
    cells = results["ppl"]
    rows = list(dict.fromkeys(k.split()[0] for k in cells))
    columns = sorted({(k.split()[1], int(k.split()[2])) for k in cells}, key=lambda c: (c[0], c[1]))
    print("\n| row | " + " | ".join(f"{t} {n // 1024}k" if n >= 1024 else f"{t} {n}" for t, n in columns) + " |")
    print("|---|" + "---|" * len(columns))
    for row in rows:
        def cell(t, n):
            c, base = cells.get(f"{row} {t} {n}"), cells.get(f"none {t} {n}")
            if not c:
                return "-"
            rel = f" ({c['ppl'] / base['ppl'] - 1:+.1%})" if base and row != "none" else ""
            return f"{c['ppl']:.3f}{rel}"
        print(f"| {row} | " + " | ".join(cell(t, n) for t, n in columns) + " |")
    for key, p in results.get("passkey", {}).items():
        print(f"- passkey {key}: {p['found']}/{p['n']}, answer log-prob {stats.interval_text(p['answer_logprob'])}")


if __name__ == "__main__":
    common.run(main)
