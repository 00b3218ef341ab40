"""What does the one-pass perplexity curve cost, against one forward pass and against scoring each length
separately? And does it give the same numbers?

For a causal model whose positions do not depend on the length of the input (a static method: here
YaRN), one forward pass over L_max tokens gives the loss of every token with all the tokens before it,
so the perplexity of every prefix length n <= L_max at once: `hpe.curve_perplexity(curve, 0, n)` of a
one-pass `hpe.perplexity_curve`. Scoring length n separately is `hpe.document_perplexity(...,
max_length=n)`: the document truncated to n tokens, one pass (a sliding window of n tokens over n
tokens), the same prefix, so the same number up to float rounding.

Paths, on one document of >= L_max tokens, SmolLM2-135M patched with --method to --target:
  one_pass      perplexity_curve(length=L_max, bucket=--step, prefix=False), read at every --step
  forward       model(ids[:L_max]).logits, nothing else: the floor
  separate_4    document_perplexity at L_max/8, /4, /2, L_max (2k/4k/8k/16k for 16384)
  separate_all  document_perplexity at every --step from --step to L_max (1k, 2k, ... 16k)
All paths run in one process, interleaved (the order rotates every repeat); reported are the medians of
wall and process CPU time over repeats, and their ratios.

    python benchmarks/bench_eval_onepass.py                                     # 16384: ~30-60 min on 2 CPU cores
    python benchmarks/bench_eval_onepass.py --max-length 4096 --step 512        # a quick check
"""

from __future__ import annotations

import argparse
import json
import os
import statistics

import common
import torch

from hf_posenc import eval as hpe


def main() -> None:
    parser = common.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--max-length", type=common.count(8), default=16384)
    parser.add_argument("--step", type=common.count(1), default=1024,
                        help="bucket of the curve and spacing of separate_all")
    parser.add_argument("--method", default="yarn", help="a static variant: 'yarn', 'ntk', 'yarn beta_fast=16'")
    parser.add_argument("--target", type=common.count(0), default=0, help="patch target (0: twice the model's context)")
    parser.add_argument("--play", default="hamlet")
    parser.add_argument("--dtype", default="bfloat16", choices=common.DTYPES)
    parser.add_argument("--repeats", type=common.count(1), default=3, help="of one_pass and forward")
    parser.add_argument("--separate-repeats", type=common.count(1), default=2, help="of separate_4")
    parser.add_argument("--all-repeats", type=common.count(1), default=1, help="of separate_all")
    parser.add_argument("--json", default="", help="write the raw results here")
    args = parser.parse_args()

    lmax, step = args.max_length, args.step
    four = [lmax // 8, lmax // 4, lmax // 2, lmax]
    every = list(range(step, lmax + 1, step))
    if any(n % step for n in four) or lmax % step:   # refused before anything loads
        common.refuse(f"--max-length / 8 must be a multiple of --step ({step}) for the curve to be read there")
    model, tokenizer = common.smollm2(args.dtype)
    context = model.config.max_position_embeddings
    target = args.target or 2 * context
    ids, source = common.text(tokenizer, args.max_length, args.play)
    print(f"{common.machine()}; SmolLM2-135M {args.dtype} sdpa, {args.method!r} to {target} "
          f"(context {context}); document: {source}, {lmax} tokens", flush=True)

    def one_pass():
        curve = hpe.perplexity_curve(model, [ids], length=lmax, bucket=step, prefix=False, progress=False)
        return {n: hpe.curve_perplexity(curve, 0, n) for n in every}

    def forward():
        with torch.inference_mode():
            model(torch.tensor([ids]), use_cache=False).logits
        return {}

    def separate(lengths):
        return lambda: {n: hpe.document_perplexity(model, [ids], max_length=n, progress=False)["perplexity"]
                        for n in lengths}

    paths = {"one_pass": (one_pass, args.repeats), "forward": (forward, args.repeats),
             "separate_4": (separate(four), args.separate_repeats), "separate_all": (separate(every), args.all_repeats)}
    times = {name: [] for name in paths}
    values = {}
    with hpe.variant(model, args.method, target):
        if hpe.is_length_dependent(model):
            common.refuse(f"{args.method} is length dependent: its one-pass curve is not its prefix perplexity")
        hpe.token_nll(model, ids[:step])  # warm-up
        for rep in range(max(r for _, r in paths.values())):
            for name in common.rotated(list(paths), rep):
                fn, repeats = paths[name]
                if rep >= repeats:
                    continue
                load = os.getloadavg()[0]
                out, wall, cpu = common.timed(fn)
                times[name].append({"wall": wall, "cpu": cpu, "load": load})
                values.setdefault(name, out)
                print(f"  repeat {rep + 1} {name}: {wall:.1f} s wall, {cpu:.1f} s CPU (load {load:.1f})", flush=True)

    med = {name: {k: statistics.median(t[k] for t in ts) for k in ("wall", "cpu")} for name, ts in times.items()}
    print("\n| path | what | repeats | median wall (s) | median CPU (s) | wall / one_pass | CPU / one_pass |")
    print("|---|---|---|---|---|---|---|")
    what = {"one_pass": f"perplexity_curve over {lmax}, read at {len(every)} lengths",
            "forward": f"model(ids).logits, {lmax} tokens", "separate_4": f"document_perplexity at {four}",
            "separate_all": f"document_perplexity at every {step} to {lmax} ({len(every)} passes)"}
    for name, m in med.items():
        print(f"| {name} | {what[name]} | {len(times[name])} | {m['wall']:.1f} | {m['cpu']:.1f} | "
              f"{m['wall'] / med['one_pass']['wall']:.2f} | {m['cpu'] / med['one_pass']['cpu']:.2f} |")
    ratios = {"one_pass / forward": ("one_pass", "forward", "<= ~1.05"),
              "separate_4 / one_pass": ("separate_4", "one_pass", ">= 1.3"),
              "separate_all / one_pass": ("separate_all", "one_pass", ">= 5")}
    print("\n| ratio | wall | CPU | goal |\n|---|---|---|---|")
    for label, (a, b, goal) in ratios.items():
        print(f"| {label} | {med[a]['wall'] / med[b]['wall']:.2f} | {med[a]['cpu'] / med[b]['cpu']:.2f} | {goal} |")

    print("\n| length | one_pass | separate | relative difference |\n|---|---|---|---|")
    diffs = {}
    for n in every:
        sep = values["separate_all"].get(n, values["separate_4"].get(n))
        diffs[n] = abs(values["one_pass"][n] - sep) / sep
        print(f"| {n} | {values['one_pass'][n]:.4f} | {sep:.4f} | {diffs[n]:.1e} |")
    print(f"\nlargest relative difference {max(diffs.values()):.1e}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "source": source, "target": target, "times": times, "medians": med,
                       "values": {k: {str(n): v for n, v in d.items()} for k, d in values.items()},
                       "relative_difference": {str(n): d for n, d in diffs.items()}}, f, indent=1)


if __name__ == "__main__":
    common.run(main)
