"""A causal LM's next-token scoring, the output layer a block of positions at a time: what training
(hf_posenc/train/losses.py) and evaluation (hf_posenc/eval/) both compute. The checks that a model predicts next
tokens and that ids are in its vocabulary, its last hidden states, the logits its forward would make of them (the
families' own scalings included), per-token losses `chunk` positions at a time, eval mode for a block, and the
losses given only a short window of context (LongCE's weights, LongPPL's key tokens). A PEFT wrapper is looked
through (`unwrapped`)."""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from torch import nn

from .config import check_number
from .errors import InvalidInputError, InvalidParameterError, UnsupportedModelError

# what a class of transformers' causal LMs is named (a PEFT wrapper is looked through first)
CAUSAL_LM_NAMES = ("ForCausalLM", "LMHeadModel", "ForConditionalGeneration")


def unwrapped(model: nn.Module) -> nn.Module:
    """The transformers model itself (a PEFT wrapper's LoRA layers sit inside it)."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def decoder(model: nn.Module) -> nn.Module:
    """The decoder under the LM head (LlamaModel, ...): `base_model`, or the `model` it holds where its class names a
    prefix it does not hold (Llama 4's text-only LM: "language_model", so `base_model` is the LM itself, head and
    all); the model itself where it has neither."""
    inner = unwrapped(model)
    body = getattr(inner, "base_model", inner)
    return getattr(inner, "model", inner) if body is inner else body


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
    return decoder(model)(input_ids=input_ids, attention_mask=attention_mask, use_cache=False,
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


def check_window(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidParameterError(f"{name} must be an int >= 1, got {value!r}")


@torch.no_grad()
def short_context_losses(model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, window: int,
                         stride: int, position_ids: torch.Tensor | None = None, chunk: int = 1024) -> torch.Tensor:
    """The loss of each next token given only a short context, [batch, n - 1] aligned with the long pass's
    labels (entry t - 1: token t): windows of window + stride tokens at stride, 2 stride, ..., each scoring
    its tokens from window on (`LongCE`), at the long pass's ids (`position_ids`; None: 0..n-1); NaN where a
    token's context is not shortened (t < window + stride) or it is padding. Eval mode, no gradient."""
    check_window("window", window)
    check_window("stride", stride)
    check_number("chunk", chunk, minimum=1, integer=True, optional=False)
    batch, n = input_ids.shape
    out = torch.full((batch, n - 1), float("nan"), device=input_ids.device)
    if position_ids is None:
        position_ids = torch.arange(n, device=input_ids.device).expand(batch, n)
    # a rope that follows the input's length (longrope's two sets, dynamic scaling) is set by the largest id: each
    # short window moved up to the long pass's, the same distances, so that it reads them with the long pass's rope
    top = position_ids.amax(dim=1, keepdim=True) if rope_follows_length(model) else None
    with evaluating(model):
        for start in range(stride, n - window, stride):
            end = min(start + window + stride, n)
            ids, mask, at = input_ids[:, start:end], attention_mask[:, start:end], position_ids[:, start:end]
            if top is not None:
                at = at + (top - at.amax(dim=1, keepdim=True))
            hidden = hidden_states(model, ids, mask, at)[:, window - 1:-1]
            labels = ids[:, window:].masked_fill(mask[:, window:] == 0, -100)
            losses = next_token_losses(model, hidden, labels, chunk)
            out[:, start + window - 1:end - 1] = losses.masked_fill(labels == -100, float("nan"))
    return out


def rope_follows_length(model: nn.Module) -> bool:
    """Whether the model's rotary frequencies change with the input's largest position id: transformers' longrope
    (short and long factors) and dynamic scaling, hf_posenc's length-dependent methods."""
    from .methods.rope import LengthDependentRotary

    inner = unwrapped(model)
    if any(isinstance(m, LengthDependentRotary) for m in inner.modules()):
        return True
    params = getattr(inner.config.get_text_config(), "rope_parameters", None) or {}   # none: a bias, a table
    nested = [v for v in params.values() if isinstance(v, dict)]   # one set per layer type (Gemma 3)
    return any(p.get("rope_type") in ("longrope", "dynamic") for p in [params, *nested])
