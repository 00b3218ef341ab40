"""What does scoring every token of a long input cost, with and without hf_posenc.eval's chunked output layer?

`token_nll` runs the model body once and the output layer (and the cross-entropy) 1024 positions at a
time, so the float logits of all positions (length x vocabulary, 49152 for SmolLM2) never exist at
once. The plain way is `model(ids).logits` then cross-entropy. Each run is a fresh process (peak
resident memory is per process): load SmolLM2-135M (bf16, sdpa), score one text of --tokens tokens of
Hamlet, report wall time and peak RSS; both ways must give the same per-token losses (checked in the
parent from the saved losses).

    python benchmarks/bench_eval_memory.py --tokens 4096 8192
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile

import common
import torch


def child(mode: str, tokens: int, out: str) -> None:
    import torch.nn.functional as F

    from hf_posenc.eval import token_nll

    model, tokenizer = common.smollm2("bfloat16")
    ids = torch.tensor([common.text(tokenizer, tokens)[0]])
    base_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss

    def score():
        with torch.inference_mode():
            if mode == "chunked":
                return token_nll(model, ids)[0]
            logits = model(ids, use_cache=False).logits[0, :-1]
            return F.cross_entropy(logits.float(), ids[0, 1:], reduction="none")

    nll, seconds, _ = common.timed(score)
    torch.save(nll, out + ".pt")
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    json.dump({"mode": mode, "tokens": tokens, "seconds": seconds, "peak_rss_mb": peak / 1024,
               "model_rss_mb": base_rss / 1024}, open(out, "w"))


def main() -> None:
    parser = common.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=common.count(2), nargs="+", default=[4096, 8192])
    parser.add_argument("--child", nargs=3, metavar=("MODE", "TOKENS", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args.child[0], int(args.child[1]), args.child[2])
    print(common.machine())
    print("| tokens | way | wall (s) | peak RSS (MB) | RSS after loading (MB) | max abs diff of losses |")
    print("|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for tokens in args.tokens:
            rows = {}
            for mode in ("full", "chunked"):
                out = f"{tmp}/{mode}-{tokens}.json"
                subprocess.run([sys.executable, __file__, "--child", mode, str(tokens), out], check=True)
                rows[mode] = json.load(open(out))
            diff = (torch.load(f"{tmp}/full-{tokens}.json.pt") - torch.load(f"{tmp}/chunked-{tokens}.json.pt")).abs().max()
            for mode, r in rows.items():
                print(f"| {tokens} | {'model(ids).logits' if mode == 'full' else 'token_nll (chunked)'} | "
                      f"{r['seconds']:.1f} | {r['peak_rss_mb']:.0f} | {r['model_rss_mb']:.0f} | "
                      f"{diff.item():.2g} |", flush=True)


if __name__ == "__main__":
    common.run(main)
