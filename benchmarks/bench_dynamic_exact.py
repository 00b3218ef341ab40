"""What exact_cache=True costs per decoding step (dynamic_yarn on SmolLM2-135M, float32, one thread).

A prompt of --cache tokens of Hamlet is prefilled, then --steps decoding steps over its next tokens are
timed on two copies of the model, default and exact, their steps alternating (median CPU time per step);
also the max |delta log-prob| of each step against the full forward over the same tokens (--check steps, the
last ones). Ratio exact / default from one run. --original pretends a shorter context so that a cache of a
few thousand tokens is rescaled (the cost does not depend on the context; the gap does, through the factor
at the cache length).

    python benchmarks/bench_dynamic_exact.py --cache 3072 --steps 16 --check 2
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics

import common
import torch

import hf_posenc as hp


def main() -> None:
    parser = common.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cache", type=common.count(1), default=3000)
    parser.add_argument("--steps", type=common.count(1), default=20)
    parser.add_argument("--check", type=common.count(1), default=3, help="steps compared with the full forward")
    parser.add_argument("--factor", type=float, default=4.0)
    parser.add_argument("--original", type=common.count(2), default=1024,
                        help="pretend context (the rescaling starts past it, so a short cache is rescaled)")
    args = parser.parse_args()
    if args.check > args.steps:   # the last --check steps are compared: there are only --steps
        common.refuse(f"--check must be at most --steps ({args.steps}), got {args.check}")
    if not args.factor > 1:
        common.refuse(f"--factor must be > 1 (dynamic YaRN rescales past the context by it), got {args.factor}")
    model, tokenizer = common.smollm2("float32")
    model.config.max_position_embeddings = args.original  # so that --cache tokens are past the "context"
    tokens = torch.tensor([common.text(tokenizer, args.cache + args.steps)[0]])
    out = {"machine": common.machine(), "settings": vars(args)}
    models = {"default": model, "exact": copy.deepcopy(model)}
    caches, cpu, gaps = {}, {name: [] for name in models}, {name: [] for name in models}
    with torch.inference_mode():
        for name, m in models.items():
            hp.patch(m, "dynamic_yarn", factor=args.factor, exact_cache=name == "exact")
            caches[name] = m(tokens[:, :args.cache], use_cache=True).past_key_values
        for i, n in enumerate(range(args.cache + 1, args.cache + args.steps + 1)):
            for name in sorted(models, reverse=i % 2 == 1):  # alternate the order: shared cores drift
                # this process's CPU time: steadier than wall time on shared cores
                step, _, seconds = common.timed(
                    lambda: models[name](tokens[:, n - 1:n], past_key_values=caches[name]).logits[:, -1])
                cpu[name].append(seconds)
                if n > args.cache + args.steps - args.check:
                    full = models[name](tokens[:, :n]).logits[:, -1]
                    gaps[name].append((step.log_softmax(-1) - full.log_softmax(-1)).abs().max().item())
    for name in models:
        out[name] = {"cpu_seconds_per_step_median": statistics.median(cpu[name]),
                     "max_abs_delta_logprob": max(gaps[name])}
    out["ratio"] = out["exact"]["cpu_seconds_per_step_median"] / out["default"]["cpu_seconds_per_step_median"]
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    common.run(main)
