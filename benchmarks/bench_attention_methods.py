"""Do positions inside attention (ALiBi, relative bias, XPos, learned -> rope) keep attention fast?

The bias reaches torch's SDPA kernel as a float attention mask ([1, heads, L, L], the causal mask folded
in); XPos and the swapped rotation transform q and k before the kernel. This measures the forward time
of each patched model divided by the unpatched one, on one model object patched and unpatched in turn
(same weights), the methods round-robin in a rotating order after one warm-up pass each:
  - SmolLM2-135M (RoPE, real weights): none / alibi / relative_bias / xpos;
  - GPT-2 small (learned table, 124M, weights from config: no GPT-2 checkpoint is available offline; the
    time does not depend on the values), n_positions raised to the length: none / alibi / relative_bias / rope.
Wall-clock and process CPU time are both recorded (with one torch thread the CPU time counts only this
process's work, the steadier figure on shared cores). Then the peak memory of one forward pass at
--memory-tokens per method, each in a fresh process (peak RSS above the RSS after loading and patching).

    python benchmarks/bench_attention_methods.py --tokens 2048 --repeats 5 --memory-tokens 4096

--remapped: the methods that compute attention themselves (DCA, Self-Extend: methods/remapped.py) on
SmolLM2-135M under bfloat16 autocast, as the evaluate recipe and the other benchmarks run a model, against the
unpatched SDPA forward under the same autocast, with the fallback calls of each pass counted (the float32
reference instead of the fused kernel; goal: none, and each method <= 1.10x the unpatched time). Self-Extend
runs with max_position_embeddings = --tokens (the smallest group that reaches it), DCA at its defaults. Each
method gets one untimed warm-up pass at --warmup-tokens, then --repeats timed passes at --tokens in a rotating
order (the ratio of each pass to the unpatched pass of its round is printed too):

    OMP_NUM_THREADS=1 nice python benchmarks/bench_attention_methods.py --remapped --tokens 16384 --repeats 2
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import subprocess
import sys
import tempfile

import common
import torch
import transformers

import hf_posenc as hp
from hf_posenc.methods.remapped import RemappedAttention

MODELS = {"smollm2": ("none", "alibi", "relative_bias", "xpos"), "gpt2": ("none", "alibi", "relative_bias", "rope")}
TARGET = 1.15
REMAPPED = ("none", "dca", "self_extend")
REMAPPED_GOAL = 1.10


def build(name: str, tokens: int):
    if name == "smollm2":
        return common.smollm2("float32")[0]
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_positions=max(1024, tokens))  # GPT-2 small's shape
    return transformers.GPT2LMHeadModel(config).eval()


def token_ids(tokens: int) -> torch.Tensor:
    ids, _ = common.text(hp.load_tokenizer("smollm2"), tokens)
    return torch.tensor([ids]) % 50257  # valid for both vocabularies


def forward(model, ids) -> None:
    with torch.inference_mode():
        model(ids, use_cache=False)


def timed_forward(model, method: str, ids) -> common.Timing:
    """One forward of `model` patched with `method` (the patch itself not timed)."""
    with contextlib.nullcontext() if method == "none" else hp.patched(model, method):
        return common.timed(lambda: forward(model, ids))


def speed(name: str, tokens: int, repeats: int) -> None:
    model, ids = build(name, tokens), token_ids(tokens)
    methods = MODELS[name]
    for method in methods:  # warm-up
        timed_forward(model, method, ids)
    runs = {m: [] for m in methods}
    for r in range(repeats):
        for method in common.rotated(methods, r):
            runs[method].append(timed_forward(model, method, ids))
        print(f"  pass {r + 1}/{repeats}: " + ", ".join(f"{m} {runs[m][-1].wall:.2f}s" for m in methods), flush=True)
    base_wall, base_cpu = common.median(runs["none"]), common.median(runs["none"], "cpu")
    print(f"\n{name}, {tokens} tokens, batch 1, float32, sdpa, {repeats} passes each")
    print("| method | median wall (s) | median CPU (s) | wall ratio | CPU ratio | per-pass CPU ratios |")
    print("|---|---|---|---|---|---|")
    for method in methods:
        wall, cpu = common.median(runs[method]), common.median(runs[method], "cpu")
        # ratio of each pass to the unpatched pass of the same round
        pairs = [f"{t.cpu / b.cpu:.2f}" for t, b in zip(runs[method], runs["none"])]
        print(f"| {method} | {wall:.2f} | {cpu:.2f} | {wall / base_wall:.3f} | {cpu / base_cpu:.3f} | "
              f"{' '.join(pairs)} |")


def remapped_pass(model, method: str, ids, target: int, dtype: torch.dtype) -> tuple[common.Timing, int]:
    """One forward under `dtype` autocast of `model` patched with `method` for a `target` context (the patch
    not timed), and the kernel calls that ran the float32 reference instead of the fused kernel."""
    # Self-Extend's group follows the target (it refuses an input past its longest); DCA at its defaults
    original = model.config.max_position_embeddings
    params = {"max_position_embeddings": max(target, original)} if method == "self_extend" else {}
    with contextlib.nullcontext() if method == "none" else hp.patched(model, method, **params):
        with torch.autocast("cpu", dtype=dtype):
            timing = common.timed(lambda: forward(model, ids))
        fallbacks = sum(m.fallbacks.total() for m in model.modules() if isinstance(m, RemappedAttention))
    return timing, fallbacks


def remapped_speed(tokens: int, repeats: int, warmup_tokens: int) -> None:
    model, ids = build("smollm2", tokens), token_ids(tokens)
    dtype, methods = torch.bfloat16, list(REMAPPED)
    for method in methods:  # warm-up, shorter than a timed pass: kernels and allocator, not the length
        remapped_pass(model, method, ids[:, :warmup_tokens], tokens, dtype)
    runs, fallbacks = {m: [] for m in methods}, {m: 0 for m in methods}
    for r in range(repeats):
        for method in common.rotated(methods, r):
            timing, fell_back = remapped_pass(model, method, ids, tokens, dtype)
            runs[method].append(timing)
            fallbacks[method] += fell_back
        print(f"  pass {r + 1}/{repeats}: " + ", ".join(f"{m} {runs[m][-1].wall:.1f}s" for m in methods), flush=True)
    base_wall, base_cpu = common.median(runs["none"]), common.median(runs["none"], "cpu")
    print(f"\nsmollm2, {tokens} tokens, batch 1, float32 weights under bfloat16 autocast, sdpa, {repeats} passes "
          f"each (median), {torch.get_num_threads()} torch thread(s); goal <= {REMAPPED_GOAL}x the unpatched pass")
    print("| method | median wall (s) | median CPU (s) | wall ratio | CPU ratio | per-pass CPU ratios "
          "| fallback calls |")
    print("|---|---|---|---|---|---|---|")
    for method in methods:
        wall, cpu = common.median(runs[method]), common.median(runs[method], "cpu")
        pairs = [f"{t.cpu / b.cpu:.2f}" for t, b in zip(runs[method], runs["none"])]
        print(f"| {method} | {wall:.1f} | {cpu:.1f} | {wall / base_wall:.3f} | {cpu / base_cpu:.3f} | "
              f"{' '.join(pairs)} | {fallbacks[method]} |")


def memory_child(name: str, method: str, tokens: int, out: str) -> None:
    model, ids = build(name, tokens), token_ids(tokens)
    if method != "none":
        hp.patch(model, method)
    forward(model, ids[:, :16])
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    seconds = common.timed(lambda: forward(model, ids)).wall
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    json.dump({"seconds": seconds, "peak_above_mb": (peak - base) / 1024, "loaded_mb": base / 1024}, open(out, "w"))


def memory(name: str, tokens: int) -> None:
    print(f"\n{name}: one forward at {tokens} tokens, each method in a fresh process")
    print("| method | peak RSS above loaded model (MiB) | forward (s) |")
    print("|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for method in MODELS[name]:
            out = os.path.join(tmp, f"{method}.json")
            subprocess.run([sys.executable, __file__, "--child", name, method, str(tokens), out], check=True)
            row = json.load(open(out))
            print(f"| {method} | {row['peak_above_mb']:.0f} | {row['seconds']:.1f} |", flush=True)


def main() -> None:
    parser = common.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=common.count(2), default=2048)
    parser.add_argument("--repeats", type=common.count(1), default=5)
    parser.add_argument("--memory-tokens", type=common.count(2), default=4096)
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--threads", type=common.count(1), default=1)
    parser.add_argument("--remapped", action="store_true",
                        help="only DCA and Self-Extend on SmolLM2 under bfloat16 autocast against the unpatched pass")
    parser.add_argument("--warmup-tokens", type=common.count(1), default=1024,
                        help="--remapped: the warm-up pass's length")
    parser.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.child:
        name, method, tokens, out = args.child
        return memory_child(name, method, int(tokens), out)
    if args.remapped:
        print(f"{common.machine()}; goal ratio <= {REMAPPED_GOAL}", flush=True)
        return remapped_speed(args.tokens, args.repeats, min(args.warmup_tokens, args.tokens))
    print(f"{common.machine()}; target ratio <= {TARGET}")
    for name in args.models:
        speed(name, args.tokens, args.repeats)
    for name in args.models:
        memory(name, args.memory_tokens)


if __name__ == "__main__":
    common.run(main)
