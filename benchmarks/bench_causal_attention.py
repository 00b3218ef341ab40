"""Where a long SmolLM2 layer spends its time on this CPU: one causal SDPA call against the other ways to
compute the same attention, and the layer's matrix products, at SmolLM2-135M's shapes (9 heads, 3 KV heads,
head dim 64, hidden 576, MLP 1536), random inputs, inference mode, one warm-up then the median of --repeats.

  sdpa causal             F.scaled_dot_product_attention(is_causal=True), the unpatched model's call
  sdpa in query blocks    the same per block of --block queries against the keys up to the block's end
  matmul-softmax blocks   scores, softmax and values by plain matmuls, per block of --block queries
  mlp, projection         the layer's MLP, and one 576 -> 1536 projection, over all tokens

    python benchmarks/bench_causal_attention.py --tokens 16384 --dtype float32
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import common
import torch
import torch.nn.functional as F

HEADS, KV_HEADS, HEAD_DIM, HIDDEN, MLP = 9, 3, 64, 576, 1536


def sdpa_blocks(q, k, v, block: int) -> torch.Tensor:
    length, out = q.shape[-2], []
    for start in range(0, length, block):
        end = min(length, start + block)
        mask = torch.ones(end - start, end, dtype=torch.bool).tril(start)
        out.append(F.scaled_dot_product_attention(q[:, :, start:end], k[:, :, :end], v[:, :, :end],
                                                  attn_mask=mask, enable_gqa=True))
    return torch.cat(out, 2)


def matmul_blocks(q, k, v, block: int) -> torch.Tensor:
    batch, heads, length, dim = q.shape
    groups, kv = heads // k.shape[1], k.shape[1]
    out = torch.empty_like(q).view(batch, kv, groups, length, dim)
    grouped = q.view(batch, kv, groups, length, dim)
    for start in range(0, length, block):
        end = min(length, start + block)
        scores = grouped[:, :, :, start:end].reshape(batch, kv, -1, dim) @ k[:, :, :end].transpose(-1, -2)
        scores = scores.mul_(dim ** -0.5).view(batch, kv, groups, end - start, end)
        scores[..., start:end].masked_fill_(torch.ones(end - start, end - start, dtype=torch.bool).triu(1), -torch.inf)
        weights = scores.softmax(-1).view(batch, kv, -1, end)
        out[:, :, :, start:end] = (weights @ v[:, :, :end]).view(batch, kv, groups, end - start, dim)
    return out.view(batch, heads, length, dim)


def timed(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main() -> None:
    parser = common.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=common.count(2), default=16384)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--blocks", type=common.count(1), nargs="+", default=[2048, 4096])
    parser.add_argument("--repeats", type=common.count(1), default=1)
    args = parser.parse_args()
    dtype = getattr(torch, args.dtype)
    torch.manual_seed(0)
    q = torch.randn(1, HEADS, args.tokens, HEAD_DIM, dtype=dtype)
    k, v = (torch.randn(1, KV_HEADS, args.tokens, HEAD_DIM, dtype=dtype) for _ in range(2))
    x = torch.randn(args.tokens, HIDDEN, dtype=dtype)
    up, gate, down = torch.randn(MLP, HIDDEN, dtype=dtype), torch.randn(MLP, HIDDEN, dtype=dtype), torch.randn(
        HIDDEN, MLP, dtype=dtype)
    seconds = {}
    with torch.inference_mode():
        reference = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        seconds["sdpa causal"] = timed(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                                                enable_gqa=True), args.repeats)
        for block in args.blocks:
            for name, fn in (("sdpa in query blocks", sdpa_blocks), ("matmul-softmax blocks", matmul_blocks)):
                torch.testing.assert_close(fn(q, k, v, block), reference, rtol=1e-2, atol=1e-2)
                seconds[f"{name} {block}"] = timed(lambda fn=fn, block=block: fn(q, k, v, block), args.repeats)
        seconds["mlp"] = timed(lambda: (F.silu(x @ gate.T) * (x @ up.T)) @ down.T, args.repeats)
        seconds["projection 576 -> 1536"] = timed(lambda: x @ up.T, args.repeats)
    print(json.dumps({"machine": common.machine(), "settings": vars(args), "seconds": seconds,
                      "ratio to sdpa causal": {n: s / seconds["sdpa causal"] for n, s in seconds.items()}},
                     indent=2))


if __name__ == "__main__":
    common.run(main)
