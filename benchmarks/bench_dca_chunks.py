"""Dual Chunk Attention's chunk sizes: hf_posenc's defaults (the paper's positions, w = c / 16, chunk c - w,
successive- and inter-chunk queries at c - 1) against the sizes of the authors' released code (ChunkLlama,
since 2024-04: w = c / 8, chunk 3c/4 - w, those queries at 3c/4, `min(r + chunk_len, chunk_size)`), on the
first tokens of Shakespeare plays, SmolLM2-135M, perplexity of the first n tokens (one pass per variant: DCA
does not depend on the input length). The released code also multiplies q and k by 0.05 ln(L / c) + 1 once
the input is longer than c; that scaling is not emulated here.

    python benchmarks/bench_dca_chunks.py --plays hamlet --lengths 4096 8192 16384 32768

The released code's cap is not a parameter of hf_posenc's `dca` (every position there follows the paper):
this script sets it on the patched model's shared `DualChunkAttention` (its `original`: every query position
stays below it, so the released code's queries at 3c/4 need original = 3c/4 + 1)."""

from __future__ import annotations

import argparse
import time

import common

import hf_posenc as hp
import hf_posenc.eval as hpe
from hf_posenc.methods.dca import DualChunkAttention

VARIANTS = ("paper", "released")


def patched(model, variant: str, context: int, target: int):
    """Patch `model` with DCA as `variant` sizes it; returns the attention module its layers share."""
    window = context // 8
    sizes = {} if variant == "paper" else {"chunk_size": context * 3 // 4 - window, "local_window": window}
    hp.patch(model, "dca", max_position_embeddings=target, **sizes)
    compute = next(m for m in model.modules() if isinstance(m, DualChunkAttention))
    if variant == "released":
        compute.original = context * 3 // 4 + 1   # queries capped at original - 1 = 3c/4, as the released code
    return compute


def main() -> None:
    parser = common.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--plays", nargs="+", default=["hamlet"])
    parser.add_argument("--lengths", type=common.count(2), nargs="+", default=[4096, 8192, 16384, 32768])
    parser.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS))
    parser.add_argument("--dtype", default=None, choices=common.DTYPES,
                        help="default: bfloat16 where the hardware runs it natively, else float32")
    parser.add_argument("--out", default="runs/bench/dca_chunks.json")
    args = parser.parse_args()
    if min(args.lengths) < 2:
        parser.error(f"--lengths are token counts >= 2, got {args.lengths}")
    args.dtype = common.dtype_name(args.dtype)
    lengths = sorted(args.lengths)

    model, tokenizer = common.smollm2(args.dtype)
    context = model.config.max_position_embeddings
    docs = common.plays(tokenizer, args.plays, lengths[-1])
    settings = {**{k: v for k, v in vars(args).items() if k != "out"},
                "released": "w = c/8, chunk 3c/4 - w, queries at 3c/4"}   # (earlier files: w = c/16, queries 3c/4 - 1)
    results, save = common.results_file(args.out, settings, ["perplexity"])
    results["machine"] = f"{common.machine()}, SmolLM2-135M {args.dtype} sdpa"
    print(results["machine"], flush=True)
    for variant in args.variants:
        if variant in results["perplexity"]:
            continue
        start = time.perf_counter()
        compute = patched(model, variant, context, max(lengths[-1], context))
        try:
            res = hpe.perplexity_by_length(model, list(docs.values()), lengths, progress=False)
        finally:
            hp.unpatch(model)
        seconds = time.perf_counter() - start
        results["perplexity"][variant] = {
            "attention": compute.extra_repr(), "seconds": seconds,
            "perplexity": dict(zip(map(str, lengths), res["perplexity"])),
            "per_play": {p: dict(zip(map(str, lengths), r)) for p, r in zip(docs, res["per_document"])}}
        save()
        print(f"{variant} ({compute.extra_repr()}): "
              + ", ".join(f"{n} {p:.2f}" for n, p in zip(lengths, res["perplexity"]))
              + f" ({seconds:.0f} s)", flush=True)
    print("\n| variant | attention | " + " | ".join(map(str, lengths)) + " |")
    print("|---|---|" + "---|" * len(lengths))
    for variant, r in results["perplexity"].items():
        print(f"| {variant} | {r['attention']} | " + " | ".join(f"{r['perplexity'][str(n)]:.2f}" for n in lengths) + " |")


if __name__ == "__main__":
    common.run(main)
