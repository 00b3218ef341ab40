"""LongCE's cost in a training step: forward + backward of one window with plain cross-entropy, with LongCE at a
stride of the window (the recipe's default) and at a quarter of it (the paper's 4096 / 1024), side by side in
rotated order, on the model the CPU config trains (SmolLM2-135M patched with YaRN to 32768, 2048-token windows,
LongCE's window 512 as in RESULTS' rows). Prints each median and its ratio to plain cross-entropy.

    python benchmarks/bench_longce_step.py                       # the CPU config's shapes
    python benchmarks/bench_longce_step.py --seq-len 8192 --window 2048 --repeats 3
"""

from __future__ import annotations

import argparse

import torch

import common
import hf_posenc as hp
from hf_posenc import eval as hpe
from hf_posenc.train.losses import LongCE, TrainingLoss


def main() -> None:
    parser = common.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seq-len", type=common.count(16, 32768), default=2048,
                        help="tokens a step (at most 32768: the YaRN x4 context the model is patched to)")
    parser.add_argument("--window", type=common.count(4), default=512, help="LongCE's short window")
    parser.add_argument("--repeats", type=common.count(1, 50), default=5)
    parser.add_argument("--dtype", default="float32", choices=common.DTYPES)
    args = parser.parse_args()
    if args.window + args.window // 4 >= args.seq_len:
        common.refuse(f"--window {args.window} leaves no token a shorter context in --seq-len {args.seq_len}")
    model, tokenizer = common.smollm2(args.dtype)
    hp.patch(model, "yarn", **hpe.variant_params(model, "yarn", {}, 32768))
    model.train()
    ids, _ = common.text(tokenizer, args.seq_len)
    batch = torch.tensor([ids])
    mask = torch.ones_like(batch)
    losses = {"ce": TrainingLoss(model, objective="lm", causal=True, chunk=1024),
              "longce stride=window": TrainingLoss(model, objective="lm", causal=True, chunk=1024,
                                                   longce=LongCE(window=args.window, stride=args.window)),
              "longce stride=window/4": TrainingLoss(model, objective="lm", causal=True, chunk=1024,
                                                     longce=LongCE(window=args.window, stride=args.window // 4))}

    def step(loss):
        def run():
            model.zero_grad(set_to_none=True)
            value = loss(batch, mask)
            value.backward()
            return value.item()
        return run

    times = {name: [] for name in losses}
    for name in losses:   # warm-up, one each
        step(losses[name])()
    for round_ in range(args.repeats):
        for name in common.rotated(list(losses), round_):
            times[name].append(common.timed(step(losses[name])))
    print(common.machine(), f"SmolLM2-135M yarn x4 {args.dtype}, {args.seq_len} tokens, window {args.window}, "
                            f"{args.repeats} repeats")
    base = common.median(times["ce"])
    for name, timings in times.items():
        median = common.median(timings)
        print(f"{name}: median {median:.2f} s a step, {median / base:.2f}x plain cross-entropy")


if __name__ == "__main__":
    common.run(main)
