"""A causal LM's next-token scoring, the output layer a block of positions at a time: what training
(hf_posenc/train/losses.py) and evaluation (hf_posenc/eval/, hf_posenc/metrics/) both compute. The checks that a
model predicts next tokens and that ids are in its vocabulary, its last hidden states, the logits its forward would
make of them (the families' own scalings included), per-token losses `chunk` positions at a time, eval mode for a
block. A PEFT wrapper is looked through (`unwrapped`)."""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from torch import nn

from .config import check_number
from .errors import InvalidInputError, UnsupportedModelError

# what a class of transformers' causal LMs is named (a PEFT wrapper is looked through first)
CAUSAL_LM_NAMES = ("ForCausalLM", "LMHeadModel", "ForConditionalGeneration")


def unwrapped(model: nn.Module) -> nn.Module:
    """The transformers model itself (a PEFT wrapper's LoRA layers sit inside it)."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def check_causal_lm(model, what: str) -> None:
    """Refuse, before any work, a `model` that does not predict each next token from the ones before it (None,
    an encoder, a masked LM, an encoder-decoder): `what` scores next tokens, and such a model's output is
    another thing, or a traceback from deep inside."""
    inner = unwrapped(model) if isinstance(model, nn.Module) else model
    if not isinstance(inner, nn.Module) or not hasattr(inner, "config") or not hasattr(inner, "get_output_embeddings"):
        raise InvalidInputError(f"{what}: model must be a transformers causal LM (Llama, GPT-2, SmolLM2, ...), got "
                                f"{model!r:.60} ({type(model).__name__})")
    config = inner.config
    if getattr(config, "is_encoder_decoder", False) or inner.get_output_embeddings() is None \
            or not type(inner).__name__.endswith(CAUSAL_LM_NAMES):
        raise UnsupportedModelError(
            f"{what}: model is a {type(inner).__name__} ({getattr(config, 'model_type', '?')}), not a causal LM; it "
            f"scores each next token from the tokens before it, so it needs a causal LM (Llama, GPT-2, SmolLM2, ...)")


def vocabulary_size(model: nn.Module) -> int:
    """The number of token ids the model's input embedding takes."""
    embeddings = unwrapped(model).get_input_embeddings()
    return getattr(embeddings, "num_embeddings", None) or unwrapped(model).config.get_text_config().vocab_size


def check_token_ids(model: nn.Module, ids: torch.Tensor, name: str = "input_ids") -> None:
    """Refuse ids outside the model's vocabulary (the embedding's IndexError otherwise), naming them."""
    if ids.numel() == 0:
        return
    vocab, low, high = vocabulary_size(model), int(ids.min()), int(ids.max())
    if low < 0 or high >= vocab:
        raise InvalidInputError(f"{name} hold token ids {low}..{high}; this model's vocabulary is 0..{vocab - 1}")


def hidden_states(model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                  position_ids: torch.Tensor | None = None) -> torch.Tensor:
    """The last hidden states, before the output layer: the model's base (decoder) module."""
    extra = {} if position_ids is None else {"position_ids": position_ids}
    return unwrapped(model).base_model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False,
                                    **extra).last_hidden_state


def output_logits(model: nn.Module, hidden: torch.Tensor) -> torch.Tensor:
    """What the causal LM's forward makes of `hidden`: the output layer, then the families' own scalings
    (Gemma 2/3's soft-capping, Cohere's logit_scale, Granite's logits_scaling)."""
    inner = unwrapped(model)
    config = inner.config.get_text_config()
    logits = inner.get_output_embeddings()(hidden)
    cap = getattr(config, "final_logit_softcapping", None)
    if cap:
        logits = torch.tanh(logits / cap) * cap
    scale = getattr(inner, "logit_scale", None)
    if isinstance(scale, (int, float)) and not isinstance(scale, bool):
        logits = logits * scale
    divisor = getattr(config, "logits_scaling", None)
    if divisor:
        logits = logits / divisor
    return logits


@torch.no_grad()
def output_logits_mismatch(model: nn.Module, length: int = 8) -> str | None:
    """Why `output_logits` does not rebuild this model's logits (a tiny forward compared both ways: its
    forward does more to them than the scalings known here), or None when it does."""
    if not isinstance(model, nn.Module):
        raise InvalidInputError(f"output_logits_mismatch needs a transformers model, got {model!r:.60}")
    was_training = model.training
    model.eval()
    try:
        device = next(model.parameters()).device
        vocab = unwrapped(model).config.get_text_config().vocab_size
        ids = torch.arange(3, 3 + length, device=device)[None] % vocab
        mask = torch.ones_like(ids)
        full = model(input_ids=ids, attention_mask=mask, use_cache=False).logits.float()
        ours = output_logits(model, hidden_states(model, ids, mask)).float()
    except (AttributeError, TypeError) as err:  # no base model / output layer where transformers keeps them
        return f"{type(err).__name__}: {err}"
    finally:
        model.train(was_training)
    if torch.allclose(ours, full, rtol=1e-3, atol=1e-3 * full.abs().max().item()):
        return None
    return f"the logits rebuilt from the hidden states differ by up to {(ours - full).abs().max().item():.3g}"


def position_blocks(length: int, chunk: int) -> list[slice]:
    return [slice(a, min(a + chunk, length)) for a in range(0, length, chunk)]


@contextlib.contextmanager
def evaluating(model: nn.Module):
    """The model in eval mode inside the block (no dropout, no training-only attention), each module's own
    mode back after it."""
    modes = [(m, m.training) for m in model.modules()]
    model.eval()
    try:
        yield model
    finally:
        for module, mode in modes:
            module.training = mode


def next_token_losses(model: nn.Module, hidden: torch.Tensor, labels: torch.Tensor, chunk: int) -> torch.Tensor:
    """Per-token cross-entropy of `hidden`'s next tokens `labels` (-100: none, loss 0), `chunk` at a time."""
    check_number("chunk", chunk, minimum=0, integer=True, optional=False)
    blocks = position_blocks(hidden.shape[1], chunk) if chunk else [slice(None)]
    out = [F.cross_entropy(output_logits(model, hidden[:, b]).float().flatten(0, 1), labels[:, b].flatten(),
                           ignore_index=-100, reduction="none").view(labels[:, b].shape) for b in blocks]
    return torch.cat(out, dim=1)
