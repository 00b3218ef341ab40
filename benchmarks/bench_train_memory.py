"""Training-step memory against sequence length: SmolLM2-135M, gradient checkpointing, SDPA, AdamW.

    python benchmarks/bench_train_memory.py                       # CPU: 512 1024 2048 4096
    python benchmarks/bench_train_memory.py --lengths 8192 16384 32768   # on a GPU (yarn patch past 8k)

Each length runs in its own process: load, one warm-up step at 64 tokens (allocates the AdamW
states), then one timed training step (forward, backward, optimizer step) at the length. Peak
memory is the step's peak above what was resident before it: `torch.cuda.max_memory_allocated` on
a GPU; on a CPU the peak resident set (VmHWM, reset through /proc/self/clear_refs). With activation
checkpointing and SDPA, the peak should grow linearly with the length (the slope is reported), not
quadratically (the attention matrix is never materialized)."""

import argparse
import json
import subprocess
import sys
import time


def vm(field: str) -> float:
    for line in open("/proc/self/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024   # MiB
    raise KeyError(field)


def one(length: int, dtype: str) -> dict:
    import torch

    import hf_posenc as hp
    from hf_posenc import assets

    torch.manual_seed(0)
    cuda = torch.cuda.is_available()
    model = hp.load_model(assets.smollm2_gguf(), attn_implementation="sdpa", dtype=getattr(torch, dtype))
    if length > model.config.max_position_embeddings:
        hp.patch(model, "yarn", max_position_embeddings=length)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    device = "cuda" if cuda else "cpu"
    model.to(device).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-5, betas=(0.9, 0.95), weight_decay=0.0)

    def step(n):
        ids = torch.randint(0, model.config.vocab_size, (1, n), device=device)
        loss = model(input_ids=ids, labels=ids, use_cache=False).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    step(64)
    if cuda:
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated() / 2**20
        torch.cuda.reset_peak_memory_stats()
    else:
        base = vm("VmRSS")
        open("/proc/self/clear_refs", "w").write("5")   # reset VmHWM to the current RSS
    start = time.perf_counter()
    step(length)
    if cuda:
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    peak = torch.cuda.max_memory_allocated() / 2**20 if cuda else vm("VmHWM")
    return {"length": length, "seconds": seconds, "tokens_per_s": length / seconds, "resident_before_mib": base,
            "peak_mib": peak, "step_peak_mib": peak - base, "device": torch.cuda.get_device_name() if cuda else "cpu",
            "dtype": dtype}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[512, 1024, 2048, 4096])
    parser.add_argument("--dtype", default="float32", help="weights dtype (float32 on CPU, bfloat16 on GPU)")
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one(args.one, args.dtype)))
        return
    rows = []
    for length in args.lengths:
        out = subprocess.run([sys.executable, __file__, "--one", str(length), "--dtype", args.dtype],
                             capture_output=True, text=True)
        if out.returncode != 0:
            print(f"{length}: failed ({out.stderr.strip().splitlines()[-1] if out.stderr.strip() else out.returncode})")
            break
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
        r = rows[-1]
        print(f"{r['length']:>6} tokens: {r['seconds']:.1f} s, {r['tokens_per_s']:.0f} tok/s, "
              f"step peak {r['step_peak_mib']:.0f} MiB above {r['resident_before_mib']:.0f} MiB", flush=True)
    if len(rows) >= 2:
        import numpy as np

        x = np.array([r["length"] for r in rows], float)
        y = np.array([r["step_peak_mib"] for r in rows], float)
        slope, intercept = np.polyfit(x, y, 1)
        quad = np.polyfit(x, y, 2)
        print(json.dumps({"slope_mib_per_1k_tokens": slope * 1000, "intercept_mib": intercept,
                          "quadratic_term_mib_per_1k2": quad[0] * 1e6,
                          "ratios_per_doubling": [round(y[i + 1] / y[i], 3) for i in range(len(y) - 1)],
                          "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
