"""RoPE: what the scaling methods share, and the modules for the length-dependent ones and for rotations
done inside attention.

Rotary position embedding (Su et al. 2021) rotates each pair i of q/k channels by the angle m * theta_i at
position m, with theta_i = base^(-2i/d) (d = rotary dimension). Every scaling method (one module each:
ntk.py, yarn.py, ...) only changes the frequencies theta_i (and, for YaRN/LongRoPE, a scale on cos/sin).
Where transformers already knows a method, the method only writes the `rope_parameters` that select it;
transformers' own `ROPE_INIT_FUNCTIONS` do the arithmetic.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import torch
from torch import nn

from .. import _compat
from ..config import RopeMethodConfig
from ..errors import InvalidInputError

# Fields of a rope_parameters dict that belong to a scaling method, not to the model's base RoPE.
SCALING_KEYS = frozenset({
    "rope_type", "type", "factor", "original_max_position_embeddings", "attention_factor", "beta_fast",
    "beta_slow", "mscale", "mscale_all_dim", "truncate", "long_factor", "short_factor", "low_freq_factor",
    "high_freq_factor",
    "short_mscale", "long_mscale", "attn_factor",   # the engines' spellings of the scale (vLLM's LongRoPE, YaRN)
})
# rope_type written into a saved config for methods transformers lacks: stock loading stops with
# KeyError on this name instead of silently building a different model.
CUSTOM_ROPE_TYPE_PREFIX = _compat.CUSTOM_ROPE_TYPE_PREFIX


def inv_freq(theta: float, dim: int) -> torch.Tensor:
    """RoPE's frequencies (Su et al. 2021): theta_i = base^(-2i/d), i = 0 .. d/2 - 1."""
    return 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float) / dim))


def ntk_theta(theta: float, factor: float, dim: int) -> float:
    """NTK-aware base: stretches the lowest frequency by exactly `factor`, the highest by ~1."""
    return theta * factor ** (dim / (dim - 2))


def base_parameters(native: dict) -> dict:
    """The model's plain RoPE settings (rope_theta, partial_rotary_factor, ...) without any scaling."""
    return {k: v for k, v in native.items() if k not in SCALING_KEYS} | {"rope_type": "default"}


def optional_fields(method: RopeMethodConfig, *names: str) -> dict:
    """The fields among `names` that `method` sets (not None), for rope_parameters that omit unset keys."""
    return {n: getattr(method, n) for n in names if getattr(method, n) is not None}


def stock_parameters(method: RopeMethodConfig, native: dict, original: int, dim: int) -> dict:
    """The rope_parameters of `method` (resolved) for a layer type whose RoPE settings are `native`,
    pretrained at `original` tokens: the method's own, on the plain RoPE settings without any scaling."""
    return method.rope_parameters(base_parameters(native), original, dim)


def parameters_at_length(method: RopeMethodConfig, native: dict, original: int,
                         seq_len: int) -> tuple[dict, int] | None:
    """For a method that follows the input length, the static rope_parameters it amounts to for an input
    of `seq_len` tokens (and the length to evaluate them at), or None inside the original context (where
    the model is left exactly as it was). The scaling follows the length up to the target context and
    stays there past it, so factor 1 is the unpatched model and the target context gets exactly the
    static method at `factor`."""
    seq_len = min(seq_len, method.max_position_embeddings)
    if seq_len <= original:
        return None
    return method.parameters_at_length(base_parameters(native), original, seq_len), seq_len


class LengthDependentRotary(nn.Module):
    """Wraps a family's own rotary module, built with plain RoPE, and before each call sets its
    frequencies (and cos/sin scale) for the current input length L = max(position_ids) + 1.

    Inside the original context the wrapped module keeps its original frequencies bit for bit.
    With a KV cache, keys already cached keep the rotation they were computed with; this is how
    dynamic scaling is defined (and how transformers' own "dynamic" type behaves)."""

    def __init__(self, inner: nn.Module, layer_types: list[str | None],
                 parameters_at: Callable[[int, str | None], tuple[dict, int] | None]):
        super().__init__()
        self.inner = inner
        self.layer_types = list(layer_types)
        self.parameters_at = parameters_at
        # transformers evaluates each static equivalent on this private config copy; its
        # max_position_embeddings stays the original context ("dynamic" measures from it).
        self._scratch = copy.deepcopy(inner.config)
        self._seq_len = 0
        for layer_type in self.layer_types:
            buffer = getattr(inner, _prefix(layer_type) + "inv_freq")
            self.register_buffer(_prefix(layer_type) + "original_inv_freq", buffer.clone(), persistent=False)
        self._original_scaling = {lt: getattr(inner, _prefix(lt) + "attention_scaling") for lt in self.layer_types}

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor, *args, **kwargs):
        seq_len = int(position_ids.max()) + 1
        if seq_len != self._seq_len:
            self._set_length(seq_len, x.device)
        return self.inner(x, position_ids, *args, **kwargs)

    @torch.no_grad()
    def _set_length(self, seq_len: int, device: torch.device) -> None:
        for layer_type in self.layer_types:
            prefix = _prefix(layer_type)
            scaled = self.parameters_at(seq_len, layer_type)
            if scaled is None:
                freqs = getattr(self, prefix + "original_inv_freq")
                scaling = self._original_scaling[layer_type]
            else:
                params, length = scaled
                _compat.set_rope_parameters(self._scratch, layer_type, params)
                freqs, scaling = _compat.rope_init(self._scratch, layer_type, length, type(self.inner), device)
            current = getattr(self.inner, prefix + "inv_freq")
            setattr(self.inner, prefix + "inv_freq", freqs.to(device=current.device, dtype=current.dtype))
            setattr(self.inner, prefix + "attention_scaling", scaling)
        self._seq_len = seq_len

    def extra_repr(self) -> str:
        return f"layer_types={self.layer_types}"


def _prefix(layer_type: str | None) -> str:
    return "" if layer_type is None else f"{layer_type}_"


# -- rotation applied inside attention (learned -> rope) ------------------------------------------------

def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate the first cos.shape[-1] channels of x in the rotate-half layout (pair i is channels i
    and i + d/2, the layout of transformers' rotary modules); the other channels pass unchanged."""
    dim = cos.shape[-1]
    rotated, rest = x[..., :dim], x[..., dim:]
    half = dim // 2
    turned = torch.cat([-rotated[..., half:], rotated[..., :half]], dim=-1)
    return torch.cat([rotated * cos + turned * sin, rest], dim=-1)


class RotaryQK(nn.Module):
    """Rotates q and k ([batch, heads, length, head_dim]) by their positions with a transformers rotary
    module (`rotary`, shared by every layer, so a RoPE scaling patch rebuilds one module). Keys are
    positions 0..K-1 of the cache, queries the last Q of them; the cache holds unrotated keys, so each
    call rotates them all (the rotation depends on m - n only, which those indices give exactly)."""

    def __init__(self, rotary: nn.Module):
        super().__init__()
        self.rotary = rotary

    def forward(self, query: torch.Tensor, key: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        q_len, k_len = query.shape[-2], key.shape[-2]
        positions = torch.arange(k_len, device=key.device)[None]
        cos, sin = self.rotary(key, positions)
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)  # broadcast over heads
        return apply_rotary(query, cos[..., k_len - q_len:, :], sin[..., k_len - q_len:, :]), apply_rotary(key, cos, sin)


class NoRotation(nn.Module):
    """In place of a model's rotary module: cos = 1, sin = 0, so the model's own rotation leaves q and k
    as they are (ALiBi / relative bias on a RoPE model). `complex_frequencies`: the model multiplies q and k
    by complex frequencies (Llama 4's freqs_cis, one per pair) instead: 1 + 0j."""

    def __init__(self, rotary_dim: int, complex_frequencies: bool = False):
        super().__init__()
        self.rotary_dim, self.complex_frequencies = rotary_dim, complex_frequencies

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor, *args, **kwargs):
        if position_ids.shape[-1] != x.shape[-2]:   # x: [batch, (heads,) tokens, width] in every family
            raise InvalidInputError(f"position_ids of shape {tuple(position_ids.shape)} for an input of "
                                    f"{x.shape[-2]} tokens: give one id per token")
        if self.complex_frequencies:
            return torch.ones(*position_ids.shape, self.rotary_dim // 2, dtype=torch.complex64, device=x.device)
        shape = (*position_ids.shape, self.rotary_dim)
        return x.new_ones(shape), x.new_zeros(shape)

    def extra_repr(self) -> str:
        return f"rotary_dim={self.rotary_dim}" + (", complex_frequencies=True" if self.complex_frequencies else "")


class LayerTypeNoRotation(nn.Module):
    """In place of a rotary module with one RoPE per layer type: cos 1, sin 0 for the layer types a remapped
    method rotates itself (their q and k reach the attention call, and the KV cache, un-rotated), the
    module's own cos / sin for the others."""

    def __init__(self, rotary: nn.Module, rotary_dims: dict[str, int]):
        super().__init__()
        self.rotary, self.rotary_dims = rotary, dict(rotary_dims)

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor, layer_type: str | None = None, *args, **kwargs):
        if layer_type in self.rotary_dims:
            shape = (*position_ids.shape, self.rotary_dims[layer_type])
            return x.new_ones(shape), x.new_zeros(shape)
        return self.rotary(x, position_ids, layer_type, *args, **kwargs)

    def extra_repr(self) -> str:
        return f"unrotated={self.rotary_dims}"
