"""`hf-posenc demo`: the embedded SmolLM2-135M patched with every RoPE method to twice its context.

1. Inside the original context, every method against the unpatched model on the same text: how far
   its log-probabilities move (what a patch costs before any fine-tuning), and the perplexity.
2. Up to twice the original context, for the unpatched model, YaRN and Dual Chunk Attention by default
   (YaRN left out in float32, see `default_long_variants`; `long_variants`: any others): perplexity
   against context length (the text truncated to n tokens, n = 1/4, 1/2, 1 and 2 times the context; one
   pass for static methods, a pass per length for dynamic ones) and the figure; with `passkey=True`, also
   passkey retrieval at the longest length (a second pass per variant: off by default, so the demo stays
   within 10 minutes on 2 CPU cores, and SmolLM2-135M misses the passkey at 16k with every variant). Each long pass shows a progress bar over the model's
   layers, with the time left in it.
"""

from __future__ import annotations

import math
import os
import time
from pathlib import Path

import torch
from tqdm.auto import tqdm

from . import api, assets, corpora, loading
from . import eval as hpe
from .eval.perplexity import pass_progress

DEMO_METHODS = ("base", "ntk", "linear", "dynamic", "yarn", "dynamic_yarn", "llama3", "longrope", "dca", "self_extend")
# the baseline, the usual method, the training-free one that goes furthest; each costs a pass at the longest
# length (the passkey a second one): more are a --long-variants away
LONG_VARIANTS = ("none", "yarn", "dca")
# A 16k-token pass of SmolLM2 on 2 CPU cores: ~2 minutes in native bfloat16, ~4.5 in float32 on a CPU with
# AVX2 only (attention is 6.2 s of its ~8.5 s a layer), so there three variants take 14 minutes: two fit in 10.
# YaRN is the one left out: part 1 shows what it costs inside the context.
LONG_VARIANTS_FLOAT32_CPU = ("none", "dca")


def default_long_variants(dtype: torch.dtype) -> tuple[str, ...]:
    """Part 2's variants when none are given (the demo runs on the CPU): two in float32, three in bfloat16."""
    return LONG_VARIANTS_FLOAT32_CPU if dtype == torch.float32 else LONG_VARIANTS


# What the whole demo aims to take on 2 CPU cores when neither --long-tokens nor --long-variants is given: part 2
# is sized to the time left, from this CPU's own speed.
TARGET_SECONDS = {"native bfloat16": 180.0, "float32": 300.0}


def pass_cost(model, vocab: int, lengths: tuple[int, int] = (2048, 4096)):
    """Seconds a forward of n tokens takes here, n (a + b n), from one timed forward at each of two lengths (the
    attention's share grows with n). Returns the function: a first guess, which the first long pass corrects."""
    from .eval.perplexity import token_nll

    per_token = []
    for n in lengths:   # a pass as part 2 runs it: the decoder, the output layer in chunks, the loss
        ids = (torch.arange(n)[None] * 7 + 3) % vocab
        start = time.perf_counter()
        token_nll(model, ids)
        per_token.append((time.perf_counter() - start) / n)
    (n1, n2), (t1, t2) = lengths, per_token
    b = max(0.0, (t2 - t1) / (n2 - n1))
    a = max(t1 - b * n1, 0.0)
    return lambda n: n * (a + b * n)


# Part 2's shortest length: where SmolLM2 shows its break. At 1.25x its context the tokens past it read as well as
# DCA's (Hamlet 8192-10240: 38.97 against 38.77, 2026-11-28); at 1.5x they do not (40.4 against YaRN's 31.4).
SHORTEST = 1.5


def plan_long_part(cost, budget: float, context: int) -> tuple[int, tuple[str, ...]]:
    """(the length, the variants) part 2 starts with: twice the context if the unpatched model and DCA fit
    `budget` seconds at `cost(n)` a pass, else 1.5 times it (`SHORTEST`, whatever the time: a shorter run would show
    no break). YaRN is added once the first pass has been timed, if the time left holds it (`fits_another`)."""
    longest = 2 * context
    length = longest if len(LONG_VARIANTS_FLOAT32_CPU) * cost(longest) <= budget else int(SHORTEST * context)
    return length, LONG_VARIANTS_FLOAT32_CPU


def fits_another(seconds: list[float], deadline: float | None) -> bool:
    """Whether one more pass, as long as the slowest one timed so far, ends before `deadline` (None: no deadline)."""
    return deadline is None or time.perf_counter() + max(seconds, default=0.0) <= deadline


@torch.inference_mode()
def run(model: str = "smollm2", *, tokens: int = 512, methods: tuple[str, ...] = DEMO_METHODS,
        long_tokens: int | None = None, long_variants: tuple[str, ...] | None = None, passkey: bool = False,
        dtype: str = "auto", corpus: str = "shakespeare:hamlet", out: str | Path | None = "runs/demo",
        print_fn=print) -> dict:
    """Prints both tables (and writes the figure to `out`); returns their rows. `long_tokens=0` skips part 2.
    With neither `long_tokens` nor `long_variants` given, part 2 is sized to this CPU: its length (2 or 1.5 times
    the context) from two timed forwards (`plan_long_part`), and none and DCA at it, then YaRN if the passes timed
    leave room for it, so that the demo ends within TARGET_SECONDS; `long_tokens=None` alone is twice the context, `long_variants=None`
    alone `default_long_variants` for the dtype. Everything is checked (the model's config, the text, the
    retrieval prompt) before the weights load."""
    # the demo runs on the CPU: auto asks the CPU (not a GPU beside it) whether it runs bfloat16 natively
    torch_dtype, why = loading.resolve_dtype(dtype, "cpu")
    by_cpu = long_tokens is None and long_variants is None   # part 2 sized to this CPU, once it is timed
    defaulted = long_variants is None
    if defaulted:
        long_variants = default_long_variants(torch_dtype)
    _check_request(methods, long_variants, tokens, long_tokens, passkey)
    started = time.perf_counter()
    ref = assets.resolve_alias(model)
    info = _demo_model(ref, model)
    context = info["max_position_embeddings"]
    target = 2 * context
    if long_tokens is None:
        long_tokens = target   # the longest length part 2 may take; by_cpu may choose shorter
    if tokens > context:
        raise ValueError(f"--tokens {tokens} is past the model's context ({context}); part 1 compares inside it")
    tokenizer = loading.load_tokenizer(ref)
    text = corpora.load_corpus(corpus)[0]["text"]
    # as the tokenizer frames an input: BOS first for models that always see it (Llama, Gemma, Mistral)
    ids = torch.tensor(corpora.bos_prefix(tokenizer) + tokenizer(text, add_special_tokens=False).input_ids)
    if len(ids) < max(tokens, long_tokens):
        raise ValueError(f"{corpus} has {len(ids)} tokens; the demo needs {max(tokens, long_tokens)}")
    trials = (hpe.make_trials("passkey", tokenizer, lengths=[long_tokens], depths=[0.5], seed=0)
              if long_tokens and passkey else [])
    print_fn(f"loading {Path(ref).name} (a GGUF file not in hf_posenc's cache is de-quantized, ~20 s)")
    # dtype= at loading, not .to(dtype) after it: that would also cast the rotary inv_freq buffer to bfloat16
    lm = loading.load_model(ref, dtype=torch_dtype, attn_implementation="sdpa").eval()
    print_fn(f"dtype: {str(torch_dtype).removeprefix('torch.')} ({why})")
    print_fn(f"model: {info['model_type']}, mechanism {info['mechanism']}, rope_theta {info['rope_theta']:g}, "
             f"rotary dim {info['rotary_dim']}, context {context}; every method patched to {target}")

    deadline, optional = None, ()
    if by_cpu and long_tokens:
        long_tokens, long_variants, optional, deadline = _size_part2(lm, torch_dtype, started, tokens, methods,
                                                                     context, print_fn)
        defaulted = False   # the line it printed says why part 2 runs what it runs
        if passkey:   # the passkey at the length chosen
            trials = hpe.make_trials("passkey", tokenizer, lengths=[long_tokens], depths=[0.5], seed=0)
    inside = _inside_context(lm, ids[:tokens], methods, target)
    print_fn(f"\n1. Inside the original context: the first {tokens} tokens of {corpus}\n")
    print_fn(format_inside(inside))
    print_fn("\nΔ log-prob and KL: against the unpatched model on the same tokens. dynamic and dynamic_yarn "
             "leave inputs within the original context exactly as they were, by design.")

    past = {}
    if long_tokens:
        if defaulted and long_variants == LONG_VARIANTS_FLOAT32_CPU:
            print_fn(f"\npart 2 runs {', '.join(long_variants)}: in float32 on a CPU each {long_tokens}-token pass "
                     f"takes minutes (--long-variants {','.join(LONG_VARIANTS)} adds YaRN)")
        past = _part2(lm, ids[:long_tokens].tolist(), long_variants, target, trials, context, optional, deadline,
                      corpus, passkey, print_fn)
        if out is not None:
            _figure(past, Path(out) / "perplexity_by_length.png", context,
                    f"{info['model_type']}, {corpus}; every method patched to {target}", print_fn)
    print_fn(f"total {time.perf_counter() - started:.0f} s{busy_note()}. More: hf-posenc demo --long-variants "
             f"none,linear,ntk,dynamic,yarn,dynamic_yarn,dca,self_extend (every method past the context)"
             + ("" if passkey else ", --passkey (retrieval at the longest length, a second pass per variant)")
             + "; hf-posenc evaluate --config eval_smollm2 (perplexity curves, passkey, needle)")
    return {"inside": inside, "past": past}


def _check_request(methods, long_variants, tokens: int, long_tokens: int | None, passkey: bool) -> None:
    """`run`'s arguments, before anything loads: RoPE methods only, lengths that can run."""
    from .registry import get_method

    for spec in (*methods, *long_variants):
        name = hpe.parse_variant(spec)[0]
        if name != hpe.variants.NONE and "rope" not in get_method(name).mechanisms:
            raise ValueError(f"the demo compares RoPE methods; {name!r} applies to "
                             f"{'/'.join(get_method(name).mechanisms)} positions")
    if tokens < 2:
        raise ValueError(f"tokens must be >= 2 (the comparison inside the context), got {tokens}")
    if long_tokens is not None and (long_tokens < 0 or long_tokens == 1):
        raise ValueError(f"long_tokens must be 0 (skip part 2) or >= 2, got {long_tokens}")
    if long_tokens == 0 and passkey:
        raise ValueError("passkey hides a key in part 2's tokens, and long_tokens=0 skips part 2: give one of them")
    if long_tokens and not long_variants:
        raise ValueError("long_variants is empty; part 2 needs at least one variant (or long_tokens=0)")


def _size_part2(lm, torch_dtype, started: float, tokens: int, methods, context: int, print_fn):
    """Part 2 sized to this CPU from two timed forwards: (its length, its variants, the optional ones run if time
    is left, the deadline), and the line that says so."""
    goal = TARGET_SECONDS["native bfloat16" if torch_dtype == torch.bfloat16 else "float32"]
    cost = pass_cost(lm, lm.config.get_text_config().vocab_size, (min(2048, context // 4), min(4096, context // 2)))
    part1 = (len(methods) + 1) * cost(tokens)
    deadline = started + goal - 10   # 10 s: the figure, the tables
    long_tokens, long_variants = plan_long_part(cost, deadline - time.perf_counter() - part1, context)
    optional = tuple(v for v in LONG_VARIANTS if v not in long_variants) if torch_dtype == torch.bfloat16 else ()
    print_fn(f"part 2 sized to this CPU (a {long_tokens}-token pass ~{cost(long_tokens):.0f} s here, guessed from "
             f"two short ones): {', '.join(long_variants)} up to {long_tokens} tokens"
             + (f", then {', '.join(optional)} if the passes timed leave room" if optional else "")
             + f", to end within {goal / 60:.0f} minutes (--long-tokens and --long-variants choose)")
    return long_tokens, long_variants, optional, deadline


def _part2(lm, ids: list[int], variants, target: int, trials, context: int, optional, deadline, corpus: str,
           passkey: bool, print_fn) -> dict:
    """Part 2 run and printed: perplexity of the first n tokens up to len(ids) (and the passkey), by variant."""
    long_tokens = len(ids)
    lengths = sorted({n for n in (context // 4, context // 2, context, long_tokens) if 1 < n <= long_tokens})
    past = _past_context(lm, ids, variants, target, lengths, trials, context, optional, deadline)
    left_out = [v for v in optional if v not in past]
    if left_out:
        print_fn(f"\n{', '.join(left_out)} left out: a {long_tokens}-token pass took "
                 f"{max(r['seconds'] for r in past.values()):.0f} s here, past the time left "
                 f"(--long-variants {','.join(LONG_VARIANTS)} runs it)")
    print_fn(f"\n2. Up to {long_tokens} tokens: perplexity of the first n tokens of {corpus}"
             + (f", and a passkey hidden halfway through {long_tokens} tokens of filler\n" if passkey else "\n"))
    print_fn(format_past(past, context))
    if any(r.get("past_only") is not None for r in past.values()):
        print_fn(f"\nThe first n tokens' perplexity averages in the {context} tokens inside the context; the "
                 f"tokens past it, on their own, are where a model that cannot extend breaks.")
    return past


def _demo_model(ref: str, name: str) -> dict:
    """hp.describe of the model from its config alone (no weights); refused unless a causal LM with RoPE."""
    skeleton = loading.meta_model(ref)
    info = api.describe(skeleton)
    causal = skeleton.get_output_embeddings() is not None
    if info["mechanism"] != "rope" or not causal:
        kind = "causal LM" if causal else "model without a language-model head"
        raise ValueError(f"the demo compares RoPE scaling methods, so it needs a causal LM with rotary positions "
                         f"(Llama, Mistral, Qwen, SmolLM2, ...); {name} is a {info['model_type']} {kind} with "
                         f"{info['mechanism']} positions. For it: hf-posenc methods (what applies to "
                         f"{info['mechanism']} positions), hf-posenc patch, hf-posenc plot")
    return info


def _inside_context(model, ids: torch.Tensor, methods, target: int) -> list[dict]:
    reference = torch.log_softmax(model(ids[None]).logits[0].float(), -1)
    rows = [_row("none", {}, reference, reference, ids, 0.0)]
    for method in tqdm(methods, desc="inside the context", unit="method"):
        start = time.perf_counter()
        with hpe.variant(model, method, target) as params:
            logprobs = torch.log_softmax(model(ids[None]).logits[0].float(), -1)
        rows.append(_row(method, params, logprobs, reference, ids, time.perf_counter() - start))
    return rows


def _row(method, params, logprobs, reference, ids, seconds) -> dict:
    nll = -logprobs[:-1].gather(-1, ids[1:, None]).mean().item()
    shown = {k: v for k, v in params.items() if k != "max_position_embeddings"}
    if "long_factor" in shown:
        shown["long_factor"] = f"ramp 1..{shown['long_factor'][-1]:g}"
    return {"method": method, "params": shown, "max_abs_logprob_drift": (logprobs - reference).abs().max().item(),
            "kl": (reference.exp() * (reference - logprobs)).sum(-1).mean().item(),
            "ppl": float(torch.tensor(nll).exp()), "seconds": seconds}


def busy_note() -> str:
    """Said beside the times when other work shared the CPU (a load average above half its cores): the demo's
    goals (3 minutes with native bfloat16, 5 in float32) are for idle cores."""
    try:
        load, cores = os.getloadavg()[0], os.cpu_count() or 1
    except OSError:
        return ""
    return (f" (the CPU was busy: load average {load:.1f} on {cores} cores; on idle cores it runs faster)"
            if load > cores / 2 else "")


def past_only(by_length: dict, context: int) -> float | None:
    """The perplexity of the tokens past `context` alone, read with everything before them (from one pass: the
    longest length's loss less the context's), which the first n tokens' perplexity dilutes with the context's
    own tokens. None for a variant scored a pass per length, or without a length past the context."""
    lengths, ppl = by_length["lengths"], by_length["perplexity"]
    if not by_length["one_pass"] or context not in lengths or lengths[-1] <= context:
        return None
    total = {n: math.log(p) * (n - 1) for n, p in zip(lengths, ppl)}   # the summed loss of tokens 1 .. n - 1
    return math.exp((total[lengths[-1]] - total[context]) / (lengths[-1] - context))


def _past_context(model, ids: list[int], variants, target: int, lengths: list[int], trials, context: int,
                  optional=(), deadline: float | None = None) -> dict:
    """Each of `variants` at `lengths`, then each of `optional` while a pass as long as the slowest timed still ends
    before `deadline`."""
    rows = {}
    for spec in tqdm([*variants, *optional], desc="up to the target", unit="variant"):
        if spec in optional and not fits_another([r["seconds"] for r in rows.values()], deadline):
            continue
        start = time.perf_counter()
        with hpe.variant(model, spec, target), pass_progress(model, spec, min_tokens=lengths[-1] // 2):
            by_length = hpe.perplexity_by_length(model, [ids], lengths, progress=False)
            passkey = hpe.summarize(trials, hpe.score_trials(model, trials, progress=False)) if trials else None
        rows[spec] = {"lengths": by_length, "past_only": past_only(by_length, context), "passkey": passkey,
                      "seconds": time.perf_counter() - start}
    return rows


def _figure(past: dict, path: Path, context: int, title: str, print_fn) -> None:
    try:
        from .eval import plots
    except ImportError:  # matplotlib is optional
        print_fn("\n(no figure: pip install 'hf_posenc[plot]' for matplotlib)")
        return
    results = {k: v["lengths"] for k, v in past.items()}
    print_fn(f"\nfigure: {plots.plot_perplexity_by_length(results, path, original_context=context, title=title)}")


def format_inside(rows: list[dict]) -> str:
    lines = ["| method | parameters | max abs Δ log-prob | mean KL | ppl | time (s) |", "|---|---|---|---|---|---|"]
    for r in rows:
        params = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in r["params"].items())
        lines.append(f"| {r['method']} | {params or '-'} | {r['max_abs_logprob_drift']:.3g} | {r['kl']:.2e} | "
                     f"{r['ppl']:.2f} | {r['seconds']:.1f} |")
    return "\n".join(lines)


def format_past(rows: dict, context: int) -> str:
    first = next(iter(rows.values()))
    lengths, passkey = first["lengths"]["lengths"], first["passkey"]
    tail = lengths[-1] > context and context in lengths   # the tokens past the context, on their own
    lines = ["| variant | " + " | ".join(f"ppl {n}{' (context)' if n == context else ''}" for n in lengths)
             + (f" | ppl of tokens {context}-{lengths[-1]} only" if tail else "")
             + (f" | passkey {passkey['lengths'][0]} (answer log-prob)" if passkey else "") + " | how | time (s) |",
             "|---|" + "---|" * (len(lengths) + 2 + bool(passkey) + tail)]
    for k, r in rows.items():
        key = r["passkey"]
        found = f" | {'found' if key['by_length'][0] == 1 else 'missed'} ({key['mean_logprob']:.2f})" if key else ""
        only = (" | " + (f"{r['past_only']:.2f}" if r.get("past_only") is not None else "-")) if tail else ""
        lines.append(f"| {k} | " + " | ".join(f"{p:.2f}" for p in r["lengths"]["perplexity"]) + only + found + " | "
                     + ("one pass" if r["lengths"]["one_pass"] else "a pass per length") + f" | {r['seconds']:.0f} |")
    return "\n".join(lines)
