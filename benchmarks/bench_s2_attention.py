"""One long training step (forward + backward) of SmolLM2-135M's architecture, side by side: full attention
against S2-Attn (LongLoRA's shifted sparse attention, hf_posenc/train/s2_attention.py), and the plain loss against
LongCE (hf_posenc/train/losses.py), each its median time and its peak memory, with the ratios.

    python benchmarks/bench_s2_attention.py                            # 32k, g = 8192, LongCE window 8192
    OMP_NUM_THREADS=1 nice python benchmarks/bench_s2_attention.py --lengths 4096 --group 1024 --longce-window 1024
    python benchmarks/bench_s2_attention.py --lengths 16384 32768 --repeats 5 --out s2.json   # on a GPU

The model is built from SmolLM2-135M's config with random weights (time and memory do not depend on the
weights; no download), patched to YaRN at the length when it is past 8192, with activation checkpointing and the
recipe's chunked loss (1024 positions of logits at a time), in training mode, bf16 autocast where the device
runs it natively (`--dtype`). Rows: `full` (full attention, cross-entropy), `s2` (S2-Attn, cross-entropy),
`longce` (full attention, LongCE with short windows of --longce-window tokens, stride the window: each
token's short context 1-2 windows). The rows run round-robin, each round in another order, after a warm-up
step of each. A step is the forward and backward pass (the optimizer's step costs the same in every row).
Peak memory is the step's peak above what was resident before it: `torch.cuda.max_memory_allocated` on a
GPU; on a CPU the peak resident set (VmHWM, reset through /proc/self/clear_refs) with glibc's mmap threshold
fixed at 128 KiB (see bench_train_memory.py)."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

MMAP = "MALLOC_MMAP_THRESHOLD_"
# SmolLM2-135M's architecture (HuggingFaceTB/SmolLM2-135M-Instruct, config.json): a Llama with 9 heads,
# 3 key/value heads, 30 layers, tied embeddings
SMOLLM2 = dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
               num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=8192, rope_theta=100000.0,
               rms_norm_eps=1e-5, tie_word_embeddings=True, hidden_act="silu")
ROWS = ("full", "s2", "longce")


def smollm2_config():
    """SmolLM2-135M's config: the embedded model's own when the assets are installed, else the numbers above."""
    from transformers import LlamaConfig

    try:
        from hf_posenc import loading
        from hf_posenc.assets import resolve_alias

        return loading.meta_model(resolve_alias("smollm2")).config, "the embedded SmolLM2-135M's config"
    except Exception:   # no assets on this machine: the published numbers
        return LlamaConfig(**SMOLLM2), "SmolLM2-135M's published config"


def check(args) -> None:
    from hf_posenc.train.s2_attention import check_group

    for length in args.lengths:
        try:
            check_group(args.group, length)
        except ValueError as err:
            print(f"error: --group {args.group} at --lengths {length}: {err}", file=sys.stderr)
            raise SystemExit(2)
        if args.longce_window * 2 >= length:
            print(f"error: --longce-window {args.longce_window} leaves no token of {length} a shorter context "
                  f"(window + stride = {2 * args.longce_window} must be below the length)", file=sys.stderr)
            raise SystemExit(2)
    if args.repeats < 1:
        print(f"error: --repeats must be >= 1, got {args.repeats}", file=sys.stderr)
        raise SystemExit(2)
    if args.warmup < 0:
        print(f"error: --warmup must be >= 0, got {args.warmup}", file=sys.stderr)
        raise SystemExit(2)
    if args.out and Path(args.out).exists() and not args.overwrite:
        print(f"error: --out {args.out} exists; pass --overwrite to replace it or choose another file",
              file=sys.stderr)
        raise SystemExit(2)


def run(args) -> dict:
    import common   # benchmarks/common.py: torch with it, so only after the re-exec with the mmap threshold
    import torch

    import hf_posenc as hp
    from hf_posenc.train import s2_attention
    from hf_posenc._compat import native_bfloat16
    from hf_posenc.train.losses import LongCE, TrainingLoss
    from transformers import LlamaForCausalLM

    device = torch.device("cuda" if args.device == "auto" and torch.cuda.is_available() else
                          "cpu" if args.device == "auto" else args.device)
    cuda = device.type == "cuda"
    dtype = (torch.bfloat16 if native_bfloat16(device)[0] else torch.float32) if args.dtype == "auto" \
        else getattr(torch, args.dtype)
    config, source = smollm2_config()
    results = {"settings": {k: v for k, v in vars(args).items() if k != "overwrite"}, "config": source,
               "device": torch.cuda.get_device_name() if cuda else "cpu",
               "cpu_capability": torch.backends.cpu.get_cpu_capability(), "autocast": str(dtype), "lengths": {}}
    for length in args.lengths:
        torch.manual_seed(0)
        model = LlamaForCausalLM(config)
        model.config._attn_implementation = "sdpa"
        if length > config.max_position_embeddings:
            hp.patch(model, "yarn", max_position_embeddings=length)
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
        model.to(device).train()
        losses = {"full": TrainingLoss(model, objective="lm", causal=True, chunk=1024),
                  "longce": TrainingLoss(model, objective="lm", causal=True, chunk=1024,
                                         longce=LongCE(args.longce_window, args.longce_window))}
        losses["s2"] = losses["full"]
        ids = torch.randint(0, config.vocab_size, (1, length), generator=torch.Generator().manual_seed(1)).to(device)
        mask = torch.ones_like(ids)

        def step(row: str):
            if row == "s2":
                s2_attention.enable(model, args.group)
            try:
                with torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32):
                    loss = losses[row](ids, mask)
                loss.backward()
            finally:
                s2_attention.disable(model)
            model.zero_grad(set_to_none=True)
            if cuda:
                torch.cuda.synchronize()

        def measured(row: str) -> tuple[float, float]:
            seconds, peak, _ = common.peak_step(lambda: step(row), cuda)
            return seconds, peak

        rows = [r for r in ROWS if r in args.rows]
        for _ in range(args.warmup):   # kernels, allocator, the first gradient buffers
            for row in rows:
                step(row)
        times, peaks = {r: [] for r in rows}, {r: [] for r in rows}
        for i in range(args.repeats):
            for row in rows[i % len(rows):] + rows[:i % len(rows)]:
                seconds, peak = measured(row)
                times[row].append(seconds)
                peaks[row].append(peak)
                print(f"  {length} {row}: {seconds:.2f} s, peak +{peak:.0f} MiB", flush=True)
        cell = {r: {"median_s": statistics.median(times[r]), "times_s": times[r], "peak_mib": max(peaks[r]),
                    "tokens_per_s": length / statistics.median(times[r])} for r in rows}
        if "full" in cell:
            for row in ("s2", "longce"):
                if row in cell:
                    cell[f"{row}_vs_full"] = {"time": cell[row]["median_s"] / cell["full"]["median_s"],
                                              "peak": cell[row]["peak_mib"] / max(cell["full"]["peak_mib"], 1e-9)}
        results["lengths"][str(length)] = cell
        del model, losses
    return results


def report(results: dict) -> str:
    s = results["settings"]
    lines = [f"device {results['device']} (cpu capability {results['cpu_capability']}), autocast {results['autocast']}, "
             f"{results['config']}, S2 group {s['group']}, LongCE window {s['longce_window']}, "
             f"{s['repeats']} repeats (medians)",
             "| tokens | row | step (s) | tokens/s | peak (MiB) | time vs full | peak vs full |", "|---|---|---|---|---|---|---|"]
    for length, cell in results["lengths"].items():
        for row in ROWS:
            if row not in cell:
                continue
            ratio = cell.get(f"{row}_vs_full", {})
            lines.append(f"| {length} | {row} | {cell[row]['median_s']:.2f} | {cell[row]['tokens_per_s']:.0f} | "
                         f"{cell[row]['peak_mib']:.0f} | {ratio.get('time', 1.0):.2f}x | {ratio.get('peak', 1.0):.2f}x |")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[32768], help="tokens a step (default 32768)")
    parser.add_argument("--group", type=int, default=8192, help="S2-Attn's tokens per group (default 8192)")
    parser.add_argument("--longce-window", type=int, default=8192, help="LongCE's short window (default 8192)")
    parser.add_argument("--repeats", type=int, default=3, help="timed steps of each row (default 3)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed steps of each row first (default 1; 0 on a "
                        "CPU at 32k, where a step takes many minutes and nothing is compiled)")
    parser.add_argument("--rows", nargs="+", choices=ROWS, default=list(ROWS))
    parser.add_argument("--device", default="auto", help="auto (cuda when there is one), cpu, cuda, cuda:1, ...")
    parser.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"],
                        help="autocast dtype (auto: bf16 where the device runs it natively)")
    parser.add_argument("--out", help="also write the results to this JSON file")
    parser.add_argument("--overwrite", action="store_true", help="replace --out when it exists")
    args = parser.parse_args(argv)
    check(args)
    if os.environ.get(MMAP) is None and not (args.device.startswith("cuda") or args.device == "auto" and _has_cuda()):
        os.environ[MMAP] = "131072"   # see the docstring: peak RSS counts freed heap fragments otherwise
        os.execv(sys.executable, [sys.executable, *sys.argv])
    results = run(args)
    print(report(results))
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=2))


def _has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


if __name__ == "__main__":
    main()
