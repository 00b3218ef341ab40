"""Does a model patched by hf_posenc run as fast as the same model built natively by transformers?

For each RoPE method, two models share the same weights:
  (a) native:    transformers' own `AutoModelForCausalLM.from_config(cfg)` + `load_state_dict`, where
                 `cfg` is the unpatched config with the `rope_parameters` and `max_position_embeddings`
                 that hf_posenc wrote into the patched model's config;
  (b) hf_posenc: the unpatched model + `hp.patch(model, method, max_position_embeddings=...)`.
`dynamic_yarn` has no stock equivalent; inside the original context it must equal the unpatched
model, so its native side is the unpatched config. That pair only means something inside the original
context (8192), so dynamic_yarn is skipped when --tokens is longer.

Per method: first check the two models give the same logits, then time full forward passes
(batch 1, torch.inference_mode, sdpa, use_cache=False), interleaved a,b / b,a / a,b ... after one
warm-up each (the logits check), and the rotary module alone the same way (it is the only module that differs).
Wall-clock and process CPU time are both recorded: on shared, busy cores the CPU time (one torch
thread) is the steadier measure of the work each model does. A profiled forward pass also checks
that both models run the same aten ops on the same shapes.

    python benchmarks/bench_patch_overhead.py --tokens 2048 --repeats 7 --dtype float32 --threads 1
"""

from __future__ import annotations

import argparse
import collections
import copy
import datetime
import gc
import os
import platform
import statistics
import sys
import time

import common
import torch
from transformers import AutoModelForCausalLM

import hf_posenc as hp

METHODS = ("linear", "ntk", "yarn", "llama3", "dynamic_yarn")
NO_NATIVE = ("dynamic_yarn",)  # compared against the unpatched model (stock transformers lacks the method)
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
TARGET_RATIO = 1.02


def native_twin(source_config, original_config, weights, dtype):
    """transformers' own model: the unpatched config with the rope settings of `source_config`."""
    cfg = copy.deepcopy(original_config)
    cfg.rope_parameters = copy.deepcopy(source_config.rope_parameters)
    cfg.max_position_embeddings = source_config.max_position_embeddings
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa", dtype=dtype)
    missing, unexpected = model.load_state_dict(weights, strict=False)
    if unexpected or [k for k in missing if not k.endswith("lm_head.weight")]:
        raise RuntimeError(f"state dict mismatch: missing {missing}, unexpected {unexpected}")
    model.tie_weights()
    return model.eval()


def op_counts(model, ids) -> collections.Counter:
    """How many times each aten op runs, with its input shapes, in one steady-state forward pass (after a
    first pass at the same length, so a length-dependent rotary has already set its frequencies)."""
    with torch.inference_mode():
        forward(model, ids)
    with torch.inference_mode(), torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                                        record_shapes=True) as prof:
        forward(model, ids)
    return collections.Counter((e.name, str(e.input_shapes)) for e in prof.events() if e.name.startswith("aten::"))


def op_diff(native: collections.Counter, patched: collections.Counter, shapes: bool = True) -> str:
    """'' when both passes ran the same ops on the same shapes, else the ops only one side ran."""
    extra, missing = patched - native, native - patched
    parts = [f"+{n} {name}{sh if shapes else ''}" for (name, sh), n in sorted(extra.items())]
    parts += [f"-{n} {name}{sh if shapes else ''}" for (name, sh), n in sorted(missing.items())]
    return ", ".join(parts)


def forward(model, ids):
    return model(input_ids=ids, use_cache=False).logits


def rotary_timer(model, hidden, position_ids, inner_repeats: int):
    rotary = model.model.rotary_emb

    def run():
        for _ in range(inner_repeats):
            rotary(hidden, position_ids)
    return run


def main(argv=None) -> int:
    parser = common.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=common.count(2), default=2048)
    parser.add_argument("--repeats", type=common.count(1), default=7,
                        help="timed forward passes per model (after 1 warm-up)")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    parser.add_argument("--methods", default=",".join(METHODS), help=f"comma-separated subset of {','.join(METHODS)}")
    parser.add_argument("--max-position-embeddings", type=common.count(2), default=16384)
    parser.add_argument("--threads", type=common.count(1), default=1,
                        help="torch threads; 1 by default: on 2 shared, busy cores 2 threads ran 3-4x slower and "
                             "far noisier (OpenMP workers waiting on each other) than 1")
    parser.add_argument("--trace-tokens", type=common.count(1), default=128,
                        help="input length of the profiled forward pass that compares the aten ops of the two models")
    parser.add_argument("--rotary-repeats", type=common.count(1), default=200,
                        help="rotary-module calls per timed sample")
    args = parser.parse_args(argv)
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        parser.error(f"unknown method(s) {unknown}; choose from {', '.join(METHODS)}")
    dtype = DTYPES[args.dtype]
    torch.set_num_threads(args.threads)
    started = time.perf_counter()

    print(f"date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M UTC}")
    print(f"machine: {common.machine()} ({platform.platform()}), hf_posenc {hp.__version__}")
    print(f"model: SmolLM2-135M-Instruct (GGUF Q4_1, de-quantized), dtype={args.dtype}, sdpa, batch 1, "
          f"{args.tokens} tokens of Hamlet, inference_mode, use_cache=False; "
          f"target max_position_embeddings={args.max_position_embeddings}")
    print(f"timing: 1 warm-up (the logits check) + {args.repeats} timed forward passes per model, interleaved (a,b / b,a / ...); "
          f"rotary alone: {args.repeats} samples of {args.rotary_repeats} calls; "
          f"wall-clock and CPU time (time.process_time) both recorded")

    torch.manual_seed(0)
    model, tokenizer = common.smollm2(dtype)
    ids = torch.tensor([common.text(tokenizer, args.tokens)[0]])
    original_config = copy.deepcopy(model.config)
    original_context = original_config.max_position_embeddings
    weights = {k: v.detach().clone() for k, v in model.state_dict().items()}
    hidden = torch.zeros(1, args.tokens, model.config.hidden_size, dtype=dtype)
    position_ids = torch.arange(args.tokens).unsqueeze(0)
    print(f"loaded in {time.perf_counter() - started:.1f} s; native context {original_context}, "
          f"rope_parameters {original_config.rope_parameters}\n")

    rows = []
    for method in methods:
        if method in NO_NATIVE and args.tokens > original_context:
            print(f"{method}: skipped, {args.tokens} tokens > {original_context} has no native equivalent")
            continue
        hp.patch(model, method, max_position_embeddings=args.max_position_embeddings)
        try:
            if method in NO_NATIVE:
                native = native_twin(original_config, original_config, weights, dtype)
                native_label = "unpatched (default RoPE)"
            else:
                native = native_twin(model.config, original_config, weights, dtype)
                native_label = str(native.config.rope_parameters)
            # the only module that differs
            rot_p, rot_n = model.model.rotary_emb, native.model.rotary_emb
            with torch.inference_mode():  # these first calls are also each model's warm-up
                cos_p, sin_p = rot_p(hidden, position_ids)
                cos_n, sin_n = rot_n(hidden, position_ids)
                logits_n, logits_p = forward(native, ids), forward(model, ids)
            same_rotary = torch.equal(cos_p, cos_n) and torch.equal(sin_p, sin_n)
            same = torch.equal(logits_n, logits_p)
            max_diff = (logits_n.float() - logits_p.float()).abs().max().item()
            del logits_n, logits_p
            print(f"{method}: patched rotary {type(rot_p).__name__}, native {native_label}")
            ops_n, ops_p = op_counts(native, ids[:, :args.trace_tokens]), op_counts(model, ids[:, :args.trace_tokens])
            ops, ops_short = op_diff(ops_n, ops_p), op_diff(ops_n, ops_p, shapes=False)
            print(f"  identical cos/sin: {same_rotary}; identical logits: {same} (max |diff| {max_diff:.3g})")
            print(f"  aten ops of one forward pass ({args.trace_tokens} tokens, torch.profiler): "
                  f"{'identical (names, counts, input shapes)' if not ops else 'patched runs ' + ops}")

            with torch.inference_mode():
                tn, tp = common.interleaved(lambda: forward(native, ids), lambda: forward(model, ids), args.repeats,
                                            warmup=0)
                rn, rp = common.interleaved(rotary_timer(native, hidden, position_ids, args.rotary_repeats),
                                            rotary_timer(model, hidden, position_ids, args.rotary_repeats), args.repeats)
            wn, wp = [t.wall for t in tn], [t.wall for t in tp]
            cn, cp = [t.cpu for t in tn], [t.cpu for t in tp]
            mn, mp = statistics.median(wn), statistics.median(wp)
            cpu_ratio = statistics.median(cp) / statistics.median(cn)
            rmn, rmp = (common.median(r, "cpu") / args.rotary_repeats for r in (rn, rp))
            # ratio of paired samples too: each pair ran back to back, so it cancels slow drifts of the load
            paired = statistics.median(p / n for p, n in zip(wp, wn))
            rows.append(dict(method=method, ops=ops_short, native_ms=mn * 1e3, patched_ms=mp * 1e3, ratio=mp / mn,
                             paired=paired, cpu_ratio=cpu_ratio, rot_n_us=rmn * 1e6, rot_p_us=rmp * 1e6, same=same,
                             max_diff=max_diff))
            print(f"  wall ms native {mn * 1e3:.0f} [{min(wn) * 1e3:.0f}-{max(wn) * 1e3:.0f}], "
                  f"patched {mp * 1e3:.0f} [{min(wp) * 1e3:.0f}-{max(wp) * 1e3:.0f}], ratio {mp / mn:.3f}, "
                  f"median paired ratio {paired:.3f}")
            print(f"  CPU ms native {statistics.median(cn) * 1e3:.0f} [{min(cn) * 1e3:.0f}-{max(cn) * 1e3:.0f}], "
                  f"patched {statistics.median(cp) * 1e3:.0f} [{min(cp) * 1e3:.0f}-{max(cp) * 1e3:.0f}], "
                  f"ratio {cpu_ratio:.3f}; rotary alone (CPU us/call) native {rmn * 1e6:.0f}, patched {rmp * 1e6:.0f}"
                  f"  ({time.perf_counter() - started:.0f} s so far)", flush=True)
        finally:
            hp.unpatch(model)
            native = None
            gc.collect()

    if not rows:
        return 1
    print(f"\n### {args.tokens} tokens, {args.dtype}, max_position_embeddings={args.max_position_embeddings} "
          f"({args.repeats} timed passes each)\n")
    print("| method | identical logits | same aten ops | native ms (median) | patched ms (median) "
          "| ratio patched/native | ratio, CPU time | rotary alone µs native / patched |")
    print("|---|---|---|---:|---:|---:|---:|---:|")
    for r in rows:
        same = "yes" if r["same"] else f"no (max diff {r['max_diff']:.2g})"
        note = " (vs unpatched)" if r["method"] in NO_NATIVE else ""
        ops = "yes" if not r["ops"] else f"no, patched runs {r['ops']}"
        print(f"| {r['method']}{note} | {same} | {ops} | {r['native_ms']:.0f} | {r['patched_ms']:.0f} | {r['ratio']:.3f} "
              f"| {r['cpu_ratio']:.3f} | {r['rot_n_us']:.0f} / {r['rot_p_us']:.0f} |")
    overall = statistics.median(r["ratio"] for r in rows)
    overall_cpu = statistics.median(r["cpu_ratio"] for r in rows)
    print(f"\noverall median ratio patched/native: {overall:.3f} wall-clock, {overall_cpu:.3f} CPU time "
          f"(target <= {TARGET_RATIO}); over target: wall {[r['method'] for r in rows if r['ratio'] > TARGET_RATIO]}, "
          f"CPU {[r['method'] for r in rows if r['cpu_ratio'] > TARGET_RATIO]}")
    print(f"total time {time.perf_counter() - started:.0f} s; load average at the end "
          f"{' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    sys.exit(common.run(main))
