"""What exact_cache=True costs per decoding step (dynamic_yarn on SmolLM2-135M, float32, one thread): a prompt
of --cache tokens of Hamlet is prefilled, then --steps greedy steps are timed, default and exact in turn on
the same model; also the max |delta log-prob| of each step against the full forward over the same tokens
(--check steps, the last ones). Ratio exact / default from one run.

    python benchmarks/bench_dynamic_exact.py --cache 3000 --steps 20 --check 3
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import time

import torch

import hf_posenc as hp
from hf_posenc import assets


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cache", type=int, default=3000)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--check", type=int, default=3, help="steps compared with the full forward")
    parser.add_argument("--factor", type=float, default=4.0)
    parser.add_argument("--original", type=int, default=1024,
                        help="pretend context (the rescaling starts past it, so a short cache is rescaled)")
    args = parser.parse_args()
    ref = assets.smollm2_gguf()
    model = hp.load_model(ref, dtype=torch.float32, attn_implementation="sdpa").eval()
    model.config.max_position_embeddings = args.original  # so that --cache tokens are past the "context"
    tokens = hp.load_tokenizer(ref)(assets.shakespeare_text("hamlet"), return_tensors="pt").input_ids
    tokens = tokens[:, :args.cache + args.steps]
    out = {"machine": f"{datetime.date.today()}, {platform.machine()}, cpu capability "
                      f"{torch.backends.cpu.get_cpu_capability()}, {torch.get_num_threads()} torch threads",
           "settings": vars(args)}
    for exact in (False, True):
        hp.patch(model, "dynamic_yarn", factor=args.factor, exact_cache=exact)
        with torch.inference_mode():
            cache = model(tokens[:, :args.cache], use_cache=True).past_key_values
            seconds, gaps = [], []
            for n in range(args.cache + 1, args.cache + args.steps + 1):
                start = time.perf_counter()
                step = model(tokens[:, n - 1:n], past_key_values=cache).logits[:, -1]
                seconds.append(time.perf_counter() - start)
                if n > args.cache + args.steps - args.check:
                    full = model(tokens[:, :n]).logits[:, -1]
                    gaps.append((step.log_softmax(-1) - full.log_softmax(-1)).abs().max().item())
        hp.unpatch(model)
        out["exact" if exact else "default"] = {"seconds_per_step": sum(seconds) / len(seconds),
                                                "max_abs_delta_logprob": max(gaps)}
        print(("exact" if exact else "default"), out["exact" if exact else "default"], flush=True)
    out["ratio"] = out["exact"]["seconds_per_step"] / out["default"]["seconds_per_step"]
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
