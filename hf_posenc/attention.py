"""Positions inside attention (ALiBi, relative bias, XPos, learned -> rotary), per model instance.

transformers' attention modules call `ALL_ATTENTION_FUNCTIONS[config._attn_implementation]`. A patch
gives each self-attention module a `PositionalAttention` child (its bias table, its q/k transform)
and sets the implementation of the model's own config copy to "hf_posenc_<inner>" (inner: the one
the model ran, "sdpa" or "eager"; q/k-only methods also take flash kernels). That function, registered
once, applies the module's child, then calls the inner function: the SDPA kernel stays, with the bias
given as a float attention mask (causal and padding masks folded in). Other models, patched or not,
are untouched: the registered function only acts on modules that carry a child.
"""

from __future__ import annotations

import torch
from torch import nn

from . import _compat
from .config import AlibiConfig, AttentionMethodConfig, RelativeBiasConfig, RopeSwapConfig, XposConfig
from .errors import CheckpointMismatchError, MethodNotApplicableError
from .methods.bias import AlibiBias, RelativeBias, distances
from .methods.rope import RotaryQK
from .methods.xpos import XposScale
from .plan import PatchPlan

CHILD = "hf_posenc_attention"  # the child each patched attention module carries
PREFIX = "hf_posenc_"  # attention implementations registered here: PREFIX + the inner one


class PositionalAttention(nn.Module):
    """What one attention layer does with positions: transform q and k (`qk`), add `bias` to the scores."""

    def __init__(self, *, causal: bool, bias: nn.Module | None = None, qk: nn.Module | None = None):
        super().__init__()
        self.causal, self.bias, self.qk = causal, bias, qk
        self._memo: tuple | None = None  # a fixed bias (ALiBi) combined with the current mask

    def forward(self, query: torch.Tensor, key: torch.Tensor, mask: torch.Tensor | None):
        if self.qk is not None:
            query, key = self.qk(query, key)
        if self.bias is not None:
            mask = self.biased_mask(mask, query.shape[-2], key.shape[-2], query.dtype)
        return query, key, mask

    def biased_mask(self, mask: torch.Tensor | None, q_len: int, k_len: int, dtype: torch.dtype) -> torch.Tensor:
        """The bias [1, heads, Q, K] with the model's mask folded in: a float mask SDPA and eager both add
        to the scores. Masked places get the dtype's minimum (not -inf: a row of padding stays finite)."""
        fixed, given = isinstance(self.bias, AlibiBias), mask
        shape = (q_len, k_len, dtype, self.bias.slopes.device if fixed else None)
        if fixed and self._memo is not None and self._memo[0] is given and self._memo[1] == shape:
            return self._memo[2]  # the layers of one forward share the mask, and ALiBi's bias
        bias = self.bias(q_len, k_len, dtype)[None]
        if mask is None and self.causal and q_len > 1:
            mask = distances(q_len, k_len, bias.device)[None, None] >= 0
        if mask is not None:
            mask = mask[..., :k_len]
            bias = bias.masked_fill(~mask, torch.finfo(dtype).min) if mask.dtype == torch.bool else bias + mask
        if fixed:
            self._memo = (given, shape, bias)
        return bias

    def extra_repr(self) -> str:
        return f"causal={self.causal}"


def positional_attention(inner: str):
    """The attention function registered as PREFIX + inner."""
    def attention(module, query, key, value, attention_mask, **kwargs):
        position = getattr(module, CHILD, None)
        if position is None:
            raise RuntimeError(
                f"attn_implementation {PREFIX + inner!r} is hf_posenc's, for attention modules patched by "
                f"hp.patch; {type(module).__name__} carries no patch. Set the model's attn_implementation back to "
                f"{inner!r}"
            )
        query, key, attention_mask = position(query, key, attention_mask)
        return _compat.attention_function(inner, module)(module, query, key, value, attention_mask, **kwargs)

    attention.__name__ = f"hf_posenc_{inner}_attention"
    return attention


def plan_attention(plan: PatchPlan, model: nn.Module, method: AttentionMethodConfig, new_config,
                   rotary: nn.Module | None = None) -> None:
    """Add to `plan` a PositionalAttention child on each self-attention module of `model`, and point the
    implementation of `new_config` (the model's text config copy) at the registered function.
    `rotary`: for XPos, the rotary dimension comes from the model; for `rope`, the rotary module."""
    config = model.config.get_text_config()
    if model.config.is_encoder_decoder:
        raise MethodNotApplicableError(
            f"method {method.name!r} is built for decoder-only and encoder-only models; this {config.model_type} "
            f"model is an encoder-decoder (its cross-attention has no relative positions)"
        )
    inner = _compat.attention_implementation(config)
    if inner.startswith(PREFIX) or not _compat.known_attention(inner):
        raise MethodNotApplicableError(
            f"method {method.name!r} works through transformers' attention interface; this model runs "
            f"attn_implementation={inner!r}, which hf_posenc cannot wrap. Load it with attn_implementation='sdpa'"
        )
    if method.adds_bias and inner not in ("sdpa", "eager"):
        raise MethodNotApplicableError(
            f"method {method.name!r} adds a bias to the attention scores; this model runs attn_implementation="
            f"{inner!r}, whose kernels take no additive bias. Load it with attn_implementation='sdpa' (or 'eager')"
        )
    modules = _compat.attention_modules(model)
    if not modules:
        raise MethodNotApplicableError(
            f"method {method.name!r} needs attention modules that call transformers' attention interface; this "
            f"{config.model_type} model has none"
        )
    heads = config.num_attention_heads
    reference = next(model.parameters())
    causal = modules[0][1].is_causal
    # ALiBi is the same in every layer: one child for all of them, which builds the bias once a forward
    alibi = PositionalAttention(causal=causal, bias=AlibiBias(heads, bidirectional=not causal))
    for _, module in modules:
        bias = qk = None
        if isinstance(method, AlibiConfig):
            plan.swaps.append((module, CHILD, alibi.to(reference.device)))
            continue
        if isinstance(method, RelativeBiasConfig):
            bias = RelativeBias(heads, k=method.k, buckets=method.buckets, max_distance=method.max_distance,
                                bidirectional=not module.is_causal, dtype=reference.dtype, device=reference.device)
        elif isinstance(method, XposConfig):
            qk = XposScale(_compat.head_dim(config), _compat.rotary_dim(config, None), method.gamma, method.scale_base)
        elif isinstance(method, RopeSwapConfig):
            qk = RotaryQK(rotary)
        child = PositionalAttention(causal=module.is_causal, bias=bias, qk=qk)
        plan.swaps.append((module, CHILD, child.to(reference.device)))
    for kind in {inner, "eager"}:  # eager too: what tools that need attention weights switch to
        _compat.register_attention(PREFIX + kind, positional_attention(kind), like=kind)
    _compat.set_attention_implementation(new_config, PREFIX + inner)


def describe(model: nn.Module, record: dict) -> dict:
    """What `hp.describe` says of a model patched with an attention method."""
    config = model.config.get_text_config()
    mechanism = {"alibi": "bias", "relative_bias": "bias", "xpos": "rope", "rope": "rope"}[record["method"]]
    return {"mechanism": mechanism, "attn_implementation": _compat.attention_implementation(config),
            "length_limit": None}


def trained_tensors(model: nn.Module) -> list[str]:
    """State-dict names of what an attention patch adds that a checkpoint must hold (relative tables)."""
    return [name for name in model.state_dict() if f".{CHILD}." in name]


def restore_tensors(model: nn.Module, path) -> None:
    """Read into a freshly patched `model` the tensors its patch trained (relative bias tables) from the
    checkpoint at `path`."""
    wanted = trained_tensors(model)
    if not wanted:
        return
    saved = _compat.read_checkpoint_tensors(path, wanted)
    missing = sorted(set(wanted) - set(saved))
    if missing:
        raise CheckpointMismatchError(
            f"{path}: the config records an hf_posenc attention patch, but the checkpoint lacks "
            f"{missing[:3]}{' ...' if len(missing) > 3 else ''}"
        )
    model.load_state_dict(saved, strict=False)


# what a checkpoint holds of an attention patch, which stock loading reports as unexpected
SAVED_SUFFIXES = (f".{CHILD}.bias.table",)
