"""Training-step memory against sequence length: SmolLM2-135M, gradient checkpointing, SDPA, AdamW,
the recipe's loss with the full logits (`--loss-chunk 0`) and a block of positions at a time.

    python benchmarks/bench_train_memory.py                       # CPU: 512 .. 8192, full and chunked loss
    python benchmarks/bench_train_memory.py --lengths 8192 16384 32768   # on a GPU (yarn patch past 8k)
    python benchmarks/bench_train_memory.py --lengths 2048 8192 --loss-chunk 1024 --packing joined documents \
        documents_masked     # documents kept apart (data.packing=documents: SDPA a call per document, as the
                             # recipe runs it; documents_masked: SDPA with the block-diagonal mask) against joined

Each length runs in its own process: load, one warm-up step at 64 tokens (allocates the AdamW
states), then one timed training step (forward, backward, optimizer step) at the length. Peak
memory is the step's peak above what was resident before it: `torch.cuda.max_memory_allocated` on
a GPU; on a CPU the peak resident set (VmHWM, reset through /proc/self/clear_refs), with glibc's mmap
threshold fixed at 128 KiB (MALLOC_MMAP_THRESHOLD_, set for the child processes): by default glibc raises
it to 32 MiB after the first large free, so tensors up to 32 MiB come from the heap, whose fragments stay
resident, and the peak RSS counts memory that is no longer in use (SmolLM2's base model, backward:
0.48 MiB/token resident by default, 0.14 with the fixed threshold, which is what its tensors need). With activation
checkpointing and SDPA, the peak should grow linearly with the length (the slope is reported), not
quadratically (the attention matrix is never materialized)."""

import argparse
import json
import os
import subprocess
import sys

import common


DOCUMENT = 500   # --packing documents: an EOS every DOCUMENT tokens (the stdlib's modules are ~this size and up)


def one(length: int, dtype: str, chunk: int, packing: str = "joined") -> dict:
    import torch

    import hf_posenc as hp
    from hf_posenc.train.losses import TrainingLoss

    torch.manual_seed(0)
    cuda = torch.cuda.is_available()
    model = common.smollm2(dtype)[0]
    if length > model.config.max_position_embeddings:
        hp.patch(model, "yarn", max_position_embeddings=length)
    model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    device = "cuda" if cuda else "cpu"
    model.to(device).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-5, betas=(0.9, 0.95), weight_decay=0.0)
    documents = packing.startswith("documents")
    if packing == "documents":   # as the recipe trains data.packing=documents: no mask
        from hf_posenc.train.documents import use_per_document

        assert use_per_document(model)
    objective = TrainingLoss(model, objective="lm", causal=True, chunk=chunk, documents=documents)
    eos = model.config.eos_token_id if isinstance(model.config.eos_token_id, int) else 0

    def step(n):
        ids = torch.randint(1, model.config.vocab_size, (1, n), device=device)
        mask, position_ids = torch.ones_like(ids), None
        if documents:
            from hf_posenc.train.documents import document_position_ids

            ids[:, DOCUMENT - 1::DOCUMENT] = eos
            position_ids = document_position_ids(ids, mask, eos_token_id=eos)
        loss = objective(ids, mask, position_ids=position_ids)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    step(64)
    seconds, step_peak, base = common.peak_step(lambda: step(length), cuda)
    return {"length": length, "seconds": seconds, "tokens_per_s": length / seconds, "resident_before_mib": base,
            "peak_mib": base + step_peak, "step_peak_mib": step_peak, "device": torch.cuda.get_device_name() if cuda else "cpu",
            "dtype": dtype, "loss_chunk": chunk, "packing": packing}


def main():
    parser = common.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=common.count(2), nargs="+", default=[512, 1024, 2048, 4096, 8192])
    parser.add_argument("--loss-chunk", type=common.count(0), nargs="+", default=[0, 1024],
                        help="positions of logits at a time (0: the full logits); one table each")
    parser.add_argument("--dtype", default="float32", choices=common.DTYPES,
                        help="weights dtype (float32 on CPU, bfloat16 on GPU)")
    parser.add_argument("--packing", nargs="+", default=["joined"], choices=["joined", "documents", "documents_masked"],
                        help="documents: an EOS every 500 tokens, each document kept apart by a call per document "
                             "(the recipe's way); documents_masked: by SDPA's block-diagonal mask (one table each)")
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one(args.one, args.dtype, args.loss_chunk[0], args.packing[0])))
        return
    print(f"{common.machine()}, dtype {args.dtype}", flush=True)
    slopes = {(chunk, packing): table(args, chunk, packing) for chunk in args.loss_chunk for packing in args.packing}
    for packing in args.packing:
        full = slopes.get((0, packing))
        if full and len(args.loss_chunk) > 1:
            print(json.dumps({f"slope_ratio_full_over_chunk_{c}" + (f"_{packing}" if packing != "joined" else ""):
                              round(full / s, 2) for (c, p), s in slopes.items() if c and s and p == packing}))


def table(args, chunk: int, packing: str = "joined") -> float | None:
    print(f"loss_chunk={chunk} ({'full logits' if not chunk else f'{chunk} positions at a time'}), packing {packing}",
          flush=True)
    rows = []
    for length in args.lengths:
        out = subprocess.run([sys.executable, __file__, "--one", str(length), "--dtype", args.dtype,
                              "--loss-chunk", str(chunk), "--packing", packing], capture_output=True, text=True,
                             env={**os.environ, "MALLOC_MMAP_THRESHOLD_": os.environ.get("MALLOC_MMAP_THRESHOLD_", "131072")})
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
        print(json.dumps({"loss_chunk": chunk, "slope_mib_per_1k_tokens": round(slope * 1000, 1),
                          "intercept_mib": round(intercept, 1), "quadratic_term_mib_per_1k2": round(quad[0] * 1e6, 2),
                          "increments_mib_per_token": [round((y[i + 1] - y[i]) / (x[i + 1] - x[i]), 3)
                                                       for i in range(len(y) - 1)]}))
        return float(slope)
    return None


if __name__ == "__main__":
    common.run(main)
