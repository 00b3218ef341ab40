"""Shifted sparse attention (S2-Attn; Chen et al., ICLR 2024, "LongLoRA"), for training only.

In training, attention runs inside groups of `group` consecutive tokens, so a step at length n costs
n * group of attention instead of n^2 / 2; half the heads see the groups shifted by group / 2, so
information crosses from one group into the next. At inference the model uses full attention unchanged:
nothing in the weights or the saved config changes.

The groups, for a sequence of n tokens (n a multiple of g = group):
- the first ceil(h / 2) heads (the paper's `chunk(2)` on the heads): [0, g), [g, 2g), ..., [n - g, n);
- the other h // 2 heads: the same groups moved by g/2, [g/2, 3g/2), ..., [n - 3g/2, n - g/2), and one group
  that wraps around, [0, g/2) with [n - g/2, n): the paper's roll of the tokens by g/2. The paper's causal mask
  runs in the rolled order, where the first g/2 tokens come after the last ones and read them; here each group
  is causal in the order of the sequence, so no token sees one after it (the last g/2 tokens see the first g/2).
Each query attends causally inside its group (and under the model's own mask: padding, a sliding window). With
one group (g = n) every head sees everything: full attention.

`enable(model, group)` gives each self-attention module its settings and points the model's config at the
attention function registered here (NAME); the function groups only while the module is in training mode
and the queries are the keys (no cache): `model.eval()`, generation and every evaluation run transformers'
SDPA over the whole sequence. `disable(model)` puts the model's own implementation back (before saving).
Inside the groups the work is one call of torch's scaled_dot_product_attention: each head's tokens put in the
order of its groups (one index each for q, k, v), the groups side by side with the heads, causal in each.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .. import _compat
from ..attention import PREFIX
from ..errors import InvalidParameterError, MethodNotApplicableError

NAME = "hf_posenc_s2"  # the attention implementation registered here
SETTINGS = "hf_posenc_s2"  # the attribute each self-attention module carries while S2 is on


@dataclass(frozen=True)
class S2Settings:
    group: int  # tokens per group
    shift: bool  # the second half of the heads sees the groups shifted by group / 2


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
    if implementation.startswith(PREFIX) and implementation != NAME:   # S2 itself: enabled again
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
    base = _base(model)
    text = base.config.get_text_config()
    # the implementation to put back: the one before the first enable (enabling again keeps it)
    previous = base.__dict__.get(SETTINGS) or _compat.attention_implementation(text)
    modules = [m for _, m in _compat.attention_modules(model)]
    for module in modules:
        setattr(module, SETTINGS, S2Settings(group, shift))
    for config in {id(c): c for c in [text, *(getattr(m, "config", None) for m in modules)] if c is not None}.values():
        _compat.set_attention_implementation(config, NAME)
    base.__dict__[SETTINGS] = previous


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
                           f"hf_posenc.train.s2_attention.enable; {type(module).__name__} carries no S2 settings")
    full = _compat.attention_function("sdpa", module)
    if not module.training or key.shape[-2] != query.shape[-2]:
        return full(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)
    for name in ("softcap", "s_aux", "position_bias"):
        if kwargs.get(name) is not None:
            raise ValueError(f"S2-Attn runs SDPA in each group, which takes no {name}")
    out = grouped_attention(query, key, value, attention_mask, settings.group, settings.shift, scaling=scaling,
                            dropout=dropout)
    return out.transpose(1, 2).contiguous(), None


def group_order(n: int, group: int, heads: int, shift: bool = True, device=None) -> torch.Tensor:
    """[heads, n]: the tokens of each head in the order of its groups (the module docstring), each group's
    tokens ascending: the plain heads 0..n-1, the shifted heads g/2..n-g/2-1, then 0..g/2-1, n-g/2..n-1."""
    plain = torch.arange(n, device=device)
    half = group // 2
    moved = torch.cat([torch.arange(half, n - half, device=device), torch.arange(half, device=device),
                       torch.arange(n - half, n, device=device)])
    shifted = heads // 2 if shift else 0
    return torch.stack([plain] * (heads - shifted) + [moved] * shifted)


def grouped_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None,
                      group: int, shift: bool = True, *, scaling: float | None = None,
                      dropout: float = 0.0) -> torch.Tensor:
    """S2-Attn of query [b, h, n, d] over key / value [b, h_kv, n, d]: causal attention inside the groups of
    the module docstring, under `mask` (None: causal; else SDPA's bool mask [b | 1, 1 | h, n, n], True: attend,
    or a float one). Returns [b, h, n, d_v]."""
    b, heads, n = query.shape[:3]
    if n % group:
        raise ValueError(f"S2-Attn: a sequence of {n} tokens is not a whole number of groups of {group}")
    order, inverse, rows, kv_rows = _indices(n, group, heads, key.shape[1], shift, query.device)
    q, k, v = query[:, rows, order], key[:, kv_rows, order], value[:, kv_rows, order]   # [b, h, n, d]
    if mask is None:   # the groups side by side with the heads: [b, h * groups, group, d], causal in each
        out = F.scaled_dot_product_attention(*(x.reshape(b, -1, group, x.shape[-1]) for x in (q, k, v)),
                                             dropout_p=dropout, is_causal=True, scale=scaling)
    else:
        out = _masked(q, k, v, mask, order, group, scaling, dropout)
    return out.reshape(b, heads, n, -1)[:, rows, inverse]


@functools.lru_cache(maxsize=16)
def _indices(n: int, group: int, heads: int, kv_heads: int, shift: bool, device: torch.device):
    """The orders of `group_order`, their inverses, and the query / key-value head of each row (grouped-query
    attention: query head i reads key / value head i // (heads / kv_heads)); built once per shape (every layer
    and step reuses them)."""
    order = group_order(n, group, heads, shift, device)
    rows = torch.arange(heads, device=device)[:, None]
    return order, order.argsort(-1), rows, rows // (heads // kv_heads)


def _masked(q, k, v, mask, order, group: int, scaling, dropout) -> torch.Tensor:
    """The groups one at a time under the model's mask, in each head's order (padding, a sliding window); a
    query may always see itself, so that a padding query whose group holds only padding stays finite."""
    if mask.dtype != torch.bool:   # an additive float mask: where it allows
        mask = mask > torch.finfo(mask.dtype).min / 2
    n = q.shape[2]
    eye = torch.eye(group, dtype=torch.bool, device=q.device)
    parts = []
    for rows in _same_order(order):   # heads that share an order share the mask
        o = order[rows[0]]
        ordered = (mask if mask.shape[1] == 1 else mask[:, rows])[..., o[:, None], o[None, :]]
        parts.append(torch.cat([
            F.scaled_dot_product_attention(q[:, rows, s:s + group], k[:, rows, s:s + group], v[:, rows, s:s + group],
                                           attn_mask=ordered[..., s:s + group, s:s + group] | eye,
                                           dropout_p=dropout, scale=scaling)
            for s in range(0, n, group)], dim=2))
    return torch.cat(parts, dim=1)


def _same_order(order: torch.Tensor) -> list[list[int]]:
    """The heads in runs of consecutive heads with the same order (plain, then shifted)."""
    runs: list[list[int]] = []
    for head in range(order.shape[0]):
        if runs and torch.equal(order[runs[-1][0]], order[head]):
            runs[-1].append(head)
        else:
            runs.append([head])
    return runs
