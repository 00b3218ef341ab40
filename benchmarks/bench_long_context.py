"""Beyond YaRN without training (issue 14): SmolLM2-135M (8k context) at 2x and 4x, every method.

1. Perplexity of the first n tokens (n in --lengths) of each play in --plays, for each method in --methods at
   each target in --targets ("none": the unpatched model, once). `hpe.perplexity_by_length`: one pass over
   the longest length for static methods (dca, self_extend, ntk, yarn, none), a pass per length for
   dynamic_yarn.
2. Passkey at --passkey-lengths, --trials per (length, depth), target = the length's own target (the
   smallest target >= the length).
3. Forward time (process CPU time: one torch thread on shared cores) at --timing-length for dca and
   self_extend (target --targets[0]) against the unpatched SDPA forward, one run each after a warm-up, ratio
   from that run.
4. Peak memory (peak RSS above the RSS after loading) of one forward at each of --memory-lengths, each in a
   fresh process forked after loading, for none / dca / self_extend.

dtype: bfloat16 where the hardware runs it natively (a CPU with AVX512-BF16 or AMX: torch.cpu's probes), else
float32 (--dtype overrides). Results go to --out (JSON, rewritten after every
step; a rerun with the same settings resumes), the tables to stdout.

    python benchmarks/bench_long_context.py                          # hours on 2 CPU cores
    python benchmarks/bench_long_context.py --plays hamlet --lengths 1024 2048 --targets 4096 \\
        --passkey-lengths 2048 --trials 1 --timing-length 2048 --memory-lengths 1024 2048 --out /tmp/lc.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
import math
import os
import resource
import subprocess
import sys
import time

import common
import torch

import hf_posenc as hp
from hf_posenc import eval as hpe

CONTEXT = 8192  # SmolLM2-135M's trained context (what --report marks on its figure)
METHODS = ["none", "ntk", "yarn", "dynamic_yarn", "dca", "self_extend"]


def forward_seconds(model, ids: torch.Tensor, cpu: bool = False) -> float:
    """Wall time of one forward, or this process's CPU time (steadier on shared cores with one thread)."""
    with torch.inference_mode():
        timing = common.timed(lambda: model(ids, use_cache=False))
    return timing.cpu if cpu else timing.wall


def child(args) -> None:
    """One forward of --child-length tokens with --child-method at --child-target: peak RSS as JSON."""
    model, tokenizer = common.smollm2(args.dtype)
    ids = torch.tensor([common.text(tokenizer, args.child_length, args.plays[0])[0]])
    with hpe.variant(model, args.child_method, args.child_target):
        # loading (GGUF de-quantization) peaks above a short forward: fork, so the forward's process starts
        # its peak RSS count at the loaded model's RSS
        read, write = os.pipe()
        if os.fork() == 0:
            os.close(read)
            base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
            seconds = forward_seconds(model, ids)
            peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
            os.write(write, json.dumps({"base_mb": base / 1024, "peak_mb": peak / 1024,
                                        "extra_mb": (peak - base) / 1024, "seconds": seconds}).encode())
            os._exit(0)
        os.close(write)
        with os.fdopen(read) as pipe:
            print(pipe.read())
        os.wait()


def main() -> None:
    parser = common.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--plays", nargs="+", default=["hamlet", "richard_iii"])
    parser.add_argument("--methods", nargs="+", default=METHODS)
    parser.add_argument("--lengths", type=common.count(2), nargs="+", default=[4096, 8192, 16384, 32768])
    parser.add_argument("--targets", type=common.count(2), nargs="+", default=[16384, 32768])
    parser.add_argument("--passkey-lengths", type=common.count(1), nargs="*", default=[16384, 32768])
    parser.add_argument("--depths", type=float, nargs="+", default=[0.1, 0.3, 0.5, 0.7, 0.9])
    parser.add_argument("--trials", type=common.count(1), default=1, help="passkey trials per (length, depth)")
    parser.add_argument("--timing-length", type=common.count(0), default=16384, help="0: skip the timing")
    parser.add_argument("--memory-lengths", type=common.count(2), nargs="*", default=[8192, 16384, 32768])
    parser.add_argument("--dtype", default=None, choices=common.DTYPES,
                        help="default: bfloat16 where the hardware runs it natively, else float32")
    parser.add_argument("--out", default="runs/bench/long_context.json")
    parser.add_argument("--report", nargs="+", metavar="JSON",
                        help="print the tables of these results files (of earlier runs) and draw --figure; runs nothing")
    parser.add_argument("--figure", help="with --report: the perplexity figure (PNG) of --plays[0]")
    parser.add_argument("--child-method", help=argparse.SUPPRESS)
    parser.add_argument("--child-length", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--child-target", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.dtype = common.dtype_name(args.dtype)
    for spec in args.methods:
        hpe.parse_variant(spec)
    if args.child_method:
        return child(args)
    if args.report:
        return report(args.report, args.figure, args.plays[0])

    model, tokenizer = common.smollm2(args.dtype)
    context = model.config.max_position_embeddings
    lengths, targets = sorted(args.lengths), sorted(args.targets)
    docs = common.plays(tokenizer, args.plays, lengths[-1])

    settings = {k: v for k, v in vars(args).items() if k != "out" and not k.startswith("child")}
    results, save = common.results_file(args.out, settings, ["perplexity", "passkey", "timing", "memory"])
    results["machine"] = f"{common.machine()}, SmolLM2-135M {args.dtype} sdpa"
    print(results["machine"], f"; context {context}, targets {targets}", flush=True)

    for method in args.methods:  # 1. perplexity
        for target in targets[:1] if method == "none" else targets:
            label = method if method == "none" else f"{method} @{target}"
            if label in results["perplexity"]:
                continue
            start = time.perf_counter()
            with hpe.variant(model, method, target):
                params = hp.describe(model).get("params") or {}  # resolved: self_extend's group, dca's chunk
                res = hpe.perplexity_by_length(model, list(docs.values()), lengths, progress=False)
            results["perplexity"][label] = {
                "params": params,
                "perplexity": dict(zip(map(str, lengths), res["perplexity"])),
                "per_play": {p: dict(zip(map(str, lengths), r)) for p, r in zip(docs, res["per_document"])},
                "one_pass": res["one_pass"], "seconds": time.perf_counter() - start}
            save()
            print(f"{label}: " + ", ".join(f"{n} {p:.2f}" for n, p in zip(lengths, res["perplexity"]))
                  + f" ({'one pass' if res['one_pass'] else 'a pass per length'}, {time.perf_counter() - start:.0f} s)",
                  flush=True)

    for length in args.passkey_lengths:  # 2. passkey
        target = next((t for t in targets if t >= length), targets[-1])
        trials = hpe.make_trials("passkey", tokenizer, lengths=[length], depths=args.depths, trials=args.trials, seed=0)
        for method in args.methods:
            label = f"{method} {length}"
            if label in results["passkey"]:
                continue
            with hpe.variant(model, method, target):
                summary = hpe.summarize(trials, hpe.score_trials(model, trials, progress=False))
            results["passkey"][label] = {"target": target, "found": round(summary["by_length"][0] * len(trials)),
                                         "trials": len(trials), "mean_logprob": summary["mean_logprob"]}
            save()
            print(f"passkey {label}: {results['passkey'][label]['found']}/{len(trials)}", flush=True)

    if args.timing_length and not results["timing"]:  # 3. forward time against the unpatched SDPA forward
        ids = torch.tensor([common.text(tokenizer, args.timing_length, args.plays[0])[0]])
        forward_seconds(model, ids[:, :512])  # warm-up
        seconds = {"none": forward_seconds(model, ids, cpu=True)}
        for method in ("dca", "self_extend"):
            with hpe.variant(model, method, targets[0]):
                seconds[method] = forward_seconds(model, ids, cpu=True)
        results["timing"] = {"length": ids.shape[1], "clock": "process CPU time", "seconds": seconds,
                             "ratio": {m: s / seconds["none"] for m, s in seconds.items()}}
        save()
        print(f"forward at {ids.shape[1]} (CPU time): " + ", ".join(f"{m} {s:.1f} s ({s / seconds['none']:.2f}x)"
                                                        for m, s in seconds.items()), flush=True)

    for length in args.memory_lengths:  # 4. peak memory, each in a fresh process
        for method in ("none", "dca", "self_extend"):
            label = f"{method} {length}"
            if label in results["memory"]:
                continue
            run = subprocess.run([sys.executable, __file__, "--plays", args.plays[0], "--dtype", args.dtype,
                                  "--child-method", method, "--child-length", str(length),
                                  "--child-target", str(max(targets[-1], length))],
                                 capture_output=True, text=True, check=True)
            results["memory"][label] = json.loads(run.stdout.strip().splitlines()[-1])
            save()
            print(f"memory {label}: +{results['memory'][label]['extra_mb']:.0f} MB", flush=True)

    print()
    print(tables(results, lengths, context))


def report(paths: list[str], figure: str | None, play: str) -> None:
    """The tables of earlier runs' results files, and one figure: perplexity against length on `play`, every
    variant of every file (labelled with its dtype where the files differ)."""
    runs = [json.loads(Path(path).read_text()) for path in paths]
    dtypes = {run["settings"]["dtype"] for run in runs}
    curves = {}
    for path, run in zip(paths, runs):
        lengths = sorted(int(n) for r in run["perplexity"].values() for n in r["perplexity"])
        print(f"{path}: {run['machine']}\n\n{tables(run, sorted(set(lengths)), CONTEXT)}\n")
        for label, r in run["perplexity"].items():
            scores = r["per_play"].get(play)
            if scores:
                name = label if len(dtypes) == 1 else f"{label} ({run['settings']['dtype']})"
                curves[name] = {"lengths": [int(n) for n in scores], "perplexity": list(scores.values())}
    if figure and curves:
        dtype = next(iter(dtypes)) if len(dtypes) == 1 else "mixed dtypes"
        from hf_posenc.eval import plots

        path = plots.plot_perplexity_by_length(curves, figure, original_context=CONTEXT, clip_reference=True,
                                               title=f"SmolLM2-135M ({CONTEXT} context), {play}, {dtype}")
        print(f"figure: {path}")


def tables(results: dict, lengths: list[int], context: int) -> str:
    lines = ["| method | " + " | ".join(str(n) for n in lengths) + " | how |", "|---|" + "---|" * (len(lengths) + 1)]
    for label, r in results["perplexity"].items():
        lines.append(f"| {label} | " + " | ".join(f"{r['perplexity'][str(n)]:.2f}" if str(n) in r["perplexity"]
                                                  else "" for n in lengths)
                     + f" | {'one pass' if r['one_pass'] else 'a pass per length'} |")
    if "none" in results["perplexity"] and str(context) in results["perplexity"]["none"]["perplexity"]:
        ref = results["perplexity"]["none"]["perplexity"][str(context)]
        lines += ["", f"longest length against the unpatched model at its context ({context}: {ref:.2f}):"]
        lines += [f"- {label}: {r['perplexity'][str(lengths[-1])] / ref:.3f}x"
                  for label, r in results["perplexity"].items()
                  if math.isfinite(r["perplexity"].get(str(lengths[-1]), math.nan))]
    if results["passkey"]:
        lines += ["", "| passkey | found | mean answer log-prob |", "|---|---|---|"]
        lines += [f"| {k} (target {r['target']}) | {r['found']}/{r['trials']} | {r['mean_logprob']:.2f} |"
                  for k, r in results["passkey"].items()]
    if results["timing"]:
        t = results["timing"]
        lines += ["", f"forward at {t['length']} tokens: " + ", ".join(
            f"{m} {s:.1f} s ({t['ratio'][m]:.2f}x)" for m, s in t["seconds"].items())]
    if results["memory"]:
        lines += ["", "| peak memory above loading | MB |", "|---|---|"]
        lines += [f"| {k} | {r['extra_mb']:.0f} |" for k, r in results["memory"].items()]
    return "\n".join(lines)


if __name__ == "__main__":
    common.run(main)
