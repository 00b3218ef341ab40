"""Shifted sparse attention (S2-Attn; Chen et al., ICLR 2024, "LongLoRA"), for training only.

In training, attention runs inside groups of `group` consecutive tokens, so a step at length n costs
n * group of attention instead of n^2 / 2; half the heads see the groups shifted by group / 2, so
information crosses from one group into the next. At inference the model uses full attention unchanged:
nothing in the weights or the saved config changes.

The groups, for a sequence of n tokens (n a multiple of g = group):
- the first ceil(h / 2) heads (the paper's `chunk(2)` on the heads): [0, g), [g, 2g), ..., [n - g, n);
- the other h // 2 heads: [0, g/2), [g/2, 3g/2), ..., [n - g/2, n): the same groups moved by g/2, the first
  and the last one half as long. The paper's pseudocode rolls the tokens by g/2, which wraps the first g/2
  tokens around into the last group, where under its causal mask they would read the end of the sequence;
  cut at g/2 + k g instead, no token sees one after it.
Each query attends causally inside its group (and under the model's own mask: padding, a sliding window).

`enable(model, group)` gives each self-attention module its settings and points the model's config at the
attention function registered here (NAME); the function groups only while the module is in training mode
and the queries are the keys (no cache): `model.eval()`, generation and every evaluation run transformers'
SDPA over the whole sequence. `disable(model)` puts the model's own implementation back (before saving).
Inside each group the work is torch's scaled_dot_product_attention, the groups side by side in its batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from . import _compat
from .attention import PREFIX
from .errors import InvalidParameterError, MethodNotApplicableError

NAME = "hf_posenc_s2"  # the attention implementation registered here
SETTINGS = "hf_posenc_s2"  # the attribute each self-attention module carries while S2 is on


@dataclass(frozen=True)
class S2Settings:
    group: int  # tokens per group
    shift: bool  # the second half of the heads sees the groups shifted by group / 2
    previous: str  # the implementation the module's config ran before: put back by `disable`


def _base(model: nn.Module) -> nn.Module:
    """The transformers model (a PEFT wrapper's LoRA layers sit inside it)."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def why_not_groupable(model: nn.Module, shift: bool = True) -> str | None:
    """Why this model's attention cannot be computed in groups here, or None. Works on a skeleton (meta)."""
    config = _base(model).config.get_text_config()
    modules = [m for _, m in _compat.attention_modules(model)]
    if not modules:
        return (f"its {config.model_type} attention modules do not call transformers' attention interface, which "
                f"S2-Attn replaces")
    if not all(getattr(m, "is_causal", False) for m in modules):
        return "its attention is bidirectional (an encoder); S2-Attn groups the attention of a causal LM"
    implementation = _compat.attention_implementation(config)
    if implementation.startswith(PREFIX):
        return (f"it runs hf_posenc's own attention ({implementation!r}: a posenc attention method computes it), "
                f"which S2-Attn would replace")
    if getattr(config, "attn_logit_softcapping", None):
        return (f"its scores are soft-capped before the softmax (attn_logit_softcapping="
                f"{config.attn_logit_softcapping}), which the SDPA kernel S2-Attn runs in each group cannot do")
    if any(hasattr(m, "sinks") for m in modules):
        return "its attention has learned sinks, which the SDPA kernel S2-Attn runs in each group has not"
    if shift and config.num_attention_heads < 2:
        return "it has one attention head: there is no second half of the heads to shift"
    return None


def check_group(group, length: int | None = None, shift: bool = True) -> None:
    """`group` is a token count that `length` (a training sequence) splits into whole groups, even when the
    shifted groups start at group / 2."""
    if isinstance(group, bool) or not isinstance(group, int) or group < 2:
        raise InvalidParameterError(f"group must be an int >= 2 (tokens per attention group), got {group!r}")
    if shift and group % 2:
        raise InvalidParameterError(f"group={group} must be even: the shifted half of the heads sees groups "
                                    f"moved by group / 2")
    if length is not None and group > length:
        raise InvalidParameterError(f"group={group} is larger than the sequence of {length} tokens: one group "
                                    f"holds at most the whole sequence")
    if length is not None and length % group:
        raise InvalidParameterError(f"group={group} does not divide the sequence of {length} tokens into whole "
                                    f"groups; choose a divisor of {length} (a quarter: {length // 4})")


def register() -> None:
    # masks as SDPA takes them (None for a plain causal mask, else bool): the function honours them in groups
    _compat.register_attention(NAME, s2_attention, like="sdpa")


def enable(model: nn.Module, group: int, shift: bool = True) -> None:
    """Switch `model`'s self-attention to S2-Attn in training mode (a PEFT-wrapped model too)."""
    check_group(group, shift=shift)
    why = why_not_groupable(model, shift)
    if why:
        raise MethodNotApplicableError(f"S2-Attn cannot train this model: {why}")
    register()
    modules = [m for _, m in _compat.attention_modules(model)]
    configs = {id(c): c for c in [_base(model).config.get_text_config(), *(getattr(m, "config", None)
                                                                          for m in modules)] if c is not None}
    for module in modules:
        config = getattr(module, "config", None) or _base(model).config.get_text_config()
        previous = _compat.attention_implementation(config)
        if previous == NAME:   # enabled before: keep what it replaced
            previous = getattr(module, SETTINGS).previous
        setattr(module, SETTINGS, S2Settings(group, shift, previous))
    previous = getattr(modules[0], SETTINGS).previous
    for config in configs.values():
        _compat.set_attention_implementation(config, NAME)
    _base(model).__dict__[SETTINGS] = previous


def disable(model: nn.Module) -> None:
    """Full attention again, with the implementation the model ran before `enable`; nothing when S2 is off."""
    base = _base(model)
    previous = base.__dict__.pop(SETTINGS, None)
    if previous is None:
        return
    for _, module in _compat.attention_modules(model):
        if hasattr(module, SETTINGS):
            delattr(module, SETTINGS)
            if getattr(module, "config", None) is not None:
                _compat.set_attention_implementation(module.config, previous)
    _compat.set_attention_implementation(base.config.get_text_config(), previous)


def enabled(model: nn.Module) -> bool:
    return SETTINGS in _base(model).__dict__


def s2_attention(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                 attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                 **kwargs) -> tuple[torch.Tensor, None]:
    """The registered attention function: grouped in training (queries = keys), SDPA over everything else."""
    settings = getattr(module, SETTINGS, None)
    if settings is None:
        raise RuntimeError(f"attn_implementation {NAME!r} is hf_posenc's S2-Attn, switched on by "
                           f"hf_posenc.s2_attention.enable; {type(module).__name__} carries no S2 settings")
    full = _compat.attention_function("sdpa", module)
    if not module.training or key.shape[-2] != query.shape[-2]:
        return full(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)
    for name in ("softcap", "s_aux", "position_bias"):
        if kwargs.get(name) is not None:
            raise ValueError(f"S2-Attn runs SDPA in each group, which takes no {name}")
    out = grouped_attention(query, key, value, attention_mask, settings.group, settings.shift, scaling=scaling,
                            dropout=dropout)
    return out.transpose(1, 2).contiguous(), None


def grouped_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None,
                      group: int, shift: bool = True, *, scaling: float | None = None,
                      dropout: float = 0.0) -> torch.Tensor:
    """S2-Attn of query [b, h, n, d] over key / value [b, h_kv, n, d]: causal attention inside the groups of
    the module docstring, under `mask` (None: causal; else SDPA's bool mask [b | 1, 1 | h, n, n], True: attend,
    or a float one). Returns [b, h, n, d_v]."""
    heads, n = query.shape[1], query.shape[2]
    if n % group:
        raise ValueError(f"S2-Attn: a sequence of {n} tokens is not a whole number of groups of {group}")
    repeat = heads // key.shape[1]
    if repeat > 1:   # grouped-query attention: each query head's own keys and values
        key, value = key.repeat_interleave(repeat, dim=1), value.repeat_interleave(repeat, dim=1)
    if mask is not None and mask.dtype != torch.bool:   # an additive float mask: where it allows
        mask = mask > torch.finfo(mask.dtype).min / 2
    plain = heads - heads // 2 if shift else heads
    run = dict(mask=mask, scaling=scaling, dropout=dropout)
    parts = [_attend(query[:, :plain], key[:, :plain], value[:, :plain], range(0, n, group), group, **run)]
    if plain < heads:
        half = group // 2
        q, k, v = query[:, plain:], key[:, plain:], value[:, plain:]
        ends = _attend(q, k, v, (0, n - half), half, **run)   # [0, g/2) and [n - g/2, n)
        middle = [_attend(q, k, v, range(half, n - half, group), group, **run)] if n > group else []
        parts.append(torch.cat([ends[:, :, :half], *middle, ends[:, :, half:]], dim=2))
    return torch.cat(parts, dim=1)


def _attend(query, key, value, starts, size: int, *, mask, scaling, dropout) -> torch.Tensor:
    """Causal attention inside each group [s, s + size) for s in `starts`, the groups side by side in SDPA's
    batch; returns the groups' outputs one after the other along the sequence, [b, heads, len(starts) * size, d_v]."""
    starts = list(starts)
    b = query.shape[0]

    def gather(x: torch.Tensor) -> torch.Tensor:   # [b, heads, n, d] -> [b * groups, heads, size, d]
        return torch.stack([x[:, :, s:s + size] for s in starts], dim=1).flatten(0, 1)

    blocks = None
    if mask is not None:   # the model's mask inside each group; a query may always see itself (padding stays finite)
        blocks = torch.stack([mask[..., s:s + size, s:s + size] for s in starts], dim=1)
        blocks = blocks.expand(b, *blocks.shape[1:]).flatten(0, 1)
        blocks = blocks | torch.eye(size, dtype=torch.bool, device=blocks.device)
    out = F.scaled_dot_product_attention(gather(query), gather(key), gather(value), attn_mask=blocks,
                                         dropout_p=dropout, is_causal=blocks is None, scale=scaling)
    return out.unflatten(0, (b, len(starts))).transpose(1, 2).flatten(2, 3)
