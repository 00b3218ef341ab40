"""RULER's retrieval families as the project generates them (hf_posenc/eval/ruler.py) on SmolLM2-135M, each cell
with its n and interval: the figures to set beside lm-eval's own RULER tasks run through the project's lm-eval
model (docs/evaluate.md, "lm-evaluation-harness"). The families that match lm-eval's offline tasks: `passkey`
(niah_single_1: a number in repeated noise) and `vt` (ruler_vt: a chain of variable assignments; lm-eval scores
the share of the variables found, ours the whole chain, so both are printed for vt).

    python benchmarks/bench_ruler.py --families passkey vt --lengths 4096 --samples 30
    python benchmarks/bench_ruler.py --model /path/SmolLM2.gguf ...      # a machine without the embedded assets
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

import common
import hf_posenc as hp
from hf_posenc.eval import ruler, stats

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def main() -> None:
    parser = common.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--families", nargs="+", default=["passkey", "vt"], choices=list(ruler.TASKS))
    parser.add_argument("--lengths", type=common.count(2), nargs="+", default=[4096])
    parser.add_argument("--samples", type=common.count(1), default=30)
    parser.add_argument("--haystack", help="a text file for the families that hide needles in real text")
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--dtype", default="bfloat16", choices=common.DTYPES)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", help="write the rows and cells to this JSON file")
    args = parser.parse_args()
    if args.haystack and not Path(args.haystack).is_file():
        common.refuse(f"--haystack {args.haystack}: no such file")
    needing = [f for f in args.families if not ruler.TASKS[f].noise]
    if needing and not args.haystack:
        common.refuse(f"--families {' '.join(needing)} hide their needles in real text: give --haystack FILE")
    haystack = Path(args.haystack).read_text() if args.haystack else None
    args.dtype = common.dtype_name(args.dtype)   # "auto": what this hardware runs natively
    dtype = getattr(torch, args.dtype)
    model = hp.load_model(args.model, dtype=dtype, attn_implementation="sdpa").to(DEVICE).eval()
    tokenizer = hp.load_tokenizer(args.model)
    out = {"device": torch.cuda.get_device_name() if DEVICE == "cuda" else torch.backends.cpu.get_cpu_capability(),
           "dtype": args.dtype, "cells": {}}
    for family in args.families:
        samples = ruler.make_samples(family, tokenizer, lengths=args.lengths, samples=args.samples,
                                     haystack=haystack, seed=args.seed)
        start = time.perf_counter()
        with torch.autocast(DEVICE, dtype=dtype, enabled=dtype != torch.float32):
            rows = ruler.score_samples(model, samples)
        seconds = time.perf_counter() - start
        for length, cell in ruler.summarize_samples(rows)[family]["cells"].items():
            print(f"{family} @{length}: found {stats.share_text(cell)}, answer log-prob "
                  f"{stats.interval_text(cell['logprob'])}, {seconds:.0f} s", flush=True)
            out["cells"][f"{family} {length}"] = {**cell, "seconds": seconds}
        if family == "vt":   # lm-eval's ruler_vt: the share of the chain's variables in the greedy answer
            shares = []
            for sample in samples:
                p = sample.probes[0]
                ids = torch.tensor([p.prompt], device=DEVICE)
                with torch.no_grad(), torch.autocast(DEVICE, dtype=dtype, enabled=dtype != torch.float32):
                    written = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=len(p.answer) + 8,
                                             do_sample=False, pad_token_id=tokenizer.eos_token_id)[0, len(p.prompt):]
                names = tokenizer.decode(p.answer).split()
                text = tokenizer.decode(written)
                shares.append(sum(name in text for name in names) / len(names))
            cell = stats.bootstrap_mean(shares)
            print(f"vt, share of the variables written (lm-eval's score): {stats.interval_text(cell, 3)}", flush=True)
            out["cells"]["vt share"] = cell
    if args.out:
        with open(args.out, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    common.run(main)
