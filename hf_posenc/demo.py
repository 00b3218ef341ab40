"""`hf-posenc demo`: the embedded SmolLM2-135M, patched with every RoPE method to twice its
context, compared with the unpatched model on a short real text."""

from __future__ import annotations

import time

import torch
from tqdm.auto import tqdm

from . import api, assets, loading
from .registry import METHODS

DEMO_METHODS = ("base", "ntk", "linear", "dynamic", "yarn", "dynamic_yarn", "llama3", "longrope")


def demo_params(method: str, model, target: int) -> dict:
    """The parameters the demo uses for each method (a target context of `target` tokens)."""
    info = api.describe(model)
    factor = target / info["max_position_embeddings"]
    if method == "base":  # the ABF recipe: raise the base by the NTK amount for this factor
        return {"factor": factor ** (info["rotary_dim"] / (info["rotary_dim"] - 2)), "max_position_embeddings": target}
    if method == "longrope":  # no searched factors here: a ramp from 1 (fast pairs) to s (slow pairs)
        half = info["rotary_dim"] // 2
        return {"max_position_embeddings": target,
                "long_factor": [round(1 + (factor - 1) * i / (half - 1), 4) for i in range(half)]}
    return {"max_position_embeddings": target}


@torch.inference_mode()
def run(tokens: int = 512, methods: tuple[str, ...] = DEMO_METHODS, dtype: str = "float32", play: str = "hamlet",
        print_fn=print) -> list[dict]:
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        raise ValueError(f"unknown method(s) {unknown}; known: {', '.join(sorted(METHODS))}")
    started = time.perf_counter()
    path = assets.smollm2_gguf()
    print_fn(f"loading {path.name} (the first run de-quantizes and caches it, ~20 s)")
    model = loading.load_model(path, dtype=getattr(torch, dtype), attn_implementation="sdpa").eval()
    tokenizer = loading.load_tokenizer(path)
    info = api.describe(model)
    print_fn(f"model: {info['model_type']}, mechanism {info['mechanism']}, rope_theta {info['rope_theta']:g}, "
             f"rotary dim {info['rotary_dim']}, context {info['max_position_embeddings']}")
    ids = tokenizer(assets.shakespeare_text(play), return_tensors="pt").input_ids[:, :tokens]
    print_fn(f"text: {play}, first {ids.shape[1]} tokens")

    reference = torch.log_softmax(model(ids).logits.float(), -1)
    target = 2 * info["max_position_embeddings"]
    rows = [_row("none", {}, info["max_position_embeddings"], reference, reference, ids, 0.0)]
    for method in tqdm(methods, desc="patching", unit="method"):
        params = demo_params(method, model, target)
        start = time.perf_counter()
        api.patch(model, method, **params)
        logprobs = torch.log_softmax(model(ids).logits.float(), -1)
        rows.append(_row(method, params, api.describe(model)["max_position_embeddings"], logprobs, reference, ids,
                         time.perf_counter() - start))
        api.unpatch(model)

    print_fn("")
    print_fn(format_table(rows))
    print_fn(f"\ndrift = logits of the patched model against the unpatched one on the same {ids.shape[1]} tokens "
             f"(inside the original context). dynamic and dynamic_yarn are exact there by design.")
    print_fn(f"total {time.perf_counter() - started:.0f} s")
    return rows


def _row(method, params, context, logprobs, reference, ids, seconds) -> dict:
    kl = (reference.exp() * (reference - logprobs)).sum(-1).mean().item()
    nll = -logprobs[0, :-1].gather(-1, ids[0, 1:, None]).mean().item()
    shown = {k: v for k, v in params.items() if k != "max_position_embeddings"}
    if "long_factor" in shown:
        shown["long_factor"] = f"ramp 1..{shown['long_factor'][-1]:g}"
    return {"method": method, "params": shown, "context": context,
            "max_abs_logprob_drift": (logprobs - reference).abs().max().item(), "kl": kl,
            "ppl": float(torch.tensor(nll).exp()), "seconds": seconds}


def format_table(rows: list[dict]) -> str:
    lines = ["| method | parameters | context | max abs Δ log-prob | mean KL | ppl | time (s) |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        params = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in r["params"].items())
        lines.append(f"| {r['method']} | {params or '-'} | {r['context']} | {r['max_abs_logprob_drift']:.3g} | "
                     f"{r['kl']:.2e} | {r['ppl']:.2f} | {r['seconds']:.1f} |")
    return "\n".join(lines)
