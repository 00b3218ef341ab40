"""Dynamic scaling that stays exact under a KV cache (`dynamic` / `dynamic_yarn` with exact_cache=True).

Dynamic scaling picks the RoPE frequencies from the current length L. By default (as transformers' own
"dynamic" type does) a key is rotated once, when it enters the cache, with the frequencies of the length at
that step: at step t of generation the older keys carry other frequencies than a full forward over the same
t tokens would give them (transformers issue #25104). With exact_cache=True the model's rotary module rotates
nothing (`NoRotation`), the cache holds un-rotated keys, and every attention call rotates the query and
all K keys with the frequencies of length K (`RotaryQK` over the length-dependent rotary module): step t
equals the full forward of t tokens. The cost: each decoding step rotates K keys per layer instead of one.
Lengths are counted in cache slots (a left-padded row counts its padding), as a plain forward counts them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from .. import _compat
from ..attention import CHILD, PREFIX, PositionalAttention, positional_attention
from ..errors import MethodNotApplicableError
from .rope import LengthDependentRotary, NoRotation, RotaryQK, apply_rotary

if TYPE_CHECKING:
    from ..plan import PatchPlan


class ExactRotaryQK(RotaryQK):
    """RotaryQK whose cos / sin for positions 0 .. K - 1 are computed once per step and shared by every
    layer (the frequencies depend on K only)."""

    def __init__(self, rotary: torch.nn.Module):
        super().__init__(rotary)
        self._memo: tuple | None = None

    def forward(self, query: torch.Tensor, key: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        q_len, k_len = query.shape[-2], key.shape[-2]
        state = (k_len, key.dtype, key.device, torch.is_inference_mode_enabled(), torch.is_grad_enabled())
        if self._memo is None or self._memo[0] != state:
            cos, sin = self.rotary(key, torch.arange(k_len, device=key.device)[None])
            self._memo = (state, cos.unsqueeze(1), sin.unsqueeze(1))  # broadcast over heads
        _, cos, sin = self._memo
        query = apply_rotary(query, cos[..., k_len - q_len:, :], sin[..., k_len - q_len:, :])
        return query, apply_rotary(key, cos, sin)


def plan_exact_cache(plan: PatchPlan, model: torch.nn.Module, new_config, layer_types) -> None:
    """Turn a dynamic plan (its rotary modules swapped for LengthDependentRotary) into the exact one: the
    rotary modules rotate nothing, and each attention module rotates q and the whole cache itself."""
    config = model.config.get_text_config()
    if layer_types != [None]:
        raise MethodNotApplicableError(
            f"exact_cache=True rotates q and k inside attention with one RoPE; this {config.model_type} model has one "
            f"per layer type ({layer_types}). Leave exact_cache=False")
    if config.model_type in _compat.INTERLEAVED_ROTARY_MODEL_TYPES:
        raise MethodNotApplicableError(
            f"exact_cache=True rotates q and k in the rotate-half layout; {config.model_type} rotates interleaved "
            f"pairs")
    inner = _compat.attention_implementation(config)
    modules = _compat.attention_modules(model)
    if inner.startswith(PREFIX) or not _compat.known_attention(inner) or not modules:
        raise MethodNotApplicableError(
            f"exact_cache=True rotates q and k inside transformers' attention interface; this {config.model_type} "
            f"model (attn_implementation={inner!r}) cannot be wrapped there. Leave exact_cache=False")
    rotaries = {id(new): new for _, _, new in plan.swaps if isinstance(new, LengthDependentRotary)}
    if len(rotaries) != 1:
        raise MethodNotApplicableError(
            f"exact_cache=True needs the model's one rotary module; this {config.model_type} model has {len(rotaries)}")
    rotary = next(iter(rotaries.values()))
    dim = _compat.rotary_dim(config, None)
    plan.swaps[:] = [(parent, name, NoRotation(dim) if new is rotary else new) for parent, name, new in plan.swaps]
    reference = next(model.parameters())
    qk = ExactRotaryQK(rotary)  # shared: every layer rotates with the same frequencies
    plan.swaps += [(module, CHILD, PositionalAttention(causal=module.is_causal, qk=qk).to(reference.device))
                   for _, module in modules]
    for kind in {inner, "eager"}:
        _compat.register_attention(PREFIX + kind, positional_attention(kind), like=kind)
    _compat.set_attention_implementation(new_config, PREFIX + inner)
