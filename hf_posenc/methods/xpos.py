"""XPos (Sun et al. 2022, "A Length-Extrapolatable Transformer"): RoPE times a per-dimension decay.

Rotary pair i (of d/2) gets zeta_i = (2i/d + gamma) / (1 + gamma); q at position m is scaled by
zeta_i^(m / scale_base) and k at position n by zeta_i^(-n / scale_base), so their product carries
zeta_i^((m - n) / scale_base) <= 1: high-frequency pairs fade with distance, which keeps long-range
scores stable. Scaling a pair by a number commutes with rotating it, so the scale can be applied to
the rotated q and k.

Only m - n matters, so both positions are counted from the middle of the keys (the paper's
implementation does the same): the largest factor is zeta^(-L / (2 scale_base)) instead of
zeta^(-L / scale_base), which keeps 32k-token inputs well inside float32 and bfloat16 range.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import nn

from .. import _compat
from ..attention import AttentionMethodConfig, AttentionSite, PositionalAttention
from ..config import Contract, Refused, check_number, register_method
from ..errors import InvalidParameterError, MethodNotApplicableError


def xpos_zeta(rotary_dim: int, gamma: float) -> torch.Tensor:
    """zeta_i = (2i/d + gamma) / (1 + gamma) for each rotary pair i = 0 .. d/2 - 1."""
    return (torch.arange(0, rotary_dim, 2, dtype=torch.float64) / rotary_dim + gamma) / (1 + gamma)


class XposScale(nn.Module):
    """Scales rotated q and k ([batch, heads, length, head_dim], rotate-half layout: pair i is channels
    i and i + d/2) by zeta^(+-position / scale_base); channels past the rotary dimension are left alone."""

    def __init__(self, head_dim: int, rotary_dim: int, gamma: float, scale_base: float):
        super().__init__()
        self.head_dim, self.rotary_dim, self.gamma, self.scale_base = head_dim, rotary_dim, gamma, scale_base
        zeta = xpos_zeta(rotary_dim, gamma)
        log_zeta = torch.cat([zeta.log(), zeta.log(), torch.zeros(head_dim - rotary_dim, dtype=torch.float64)])
        self.register_buffer("log_zeta", log_zeta.float(), persistent=False)

    def forward(self, query: torch.Tensor, key: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        q_len, k_len = query.shape[-2], key.shape[-2]
        center = k_len // 2
        key_positions = torch.arange(k_len, device=key.device) - center
        query_positions = key_positions[k_len - q_len:]
        exponent = self.log_zeta / self.scale_base
        q_scale = torch.exp(query_positions[:, None].float() * exponent).to(query.dtype)
        k_scale = torch.exp(-key_positions[:, None].float() * exponent).to(key.dtype)
        return query * q_scale, key * k_scale

    def extra_repr(self) -> str:
        return f"rotary_dim={self.rotary_dim}, gamma={self.gamma}, scale_base={self.scale_base}"


@register_method
@dataclass
class XposConfig(AttentionMethodConfig):
    """XPos (Sun et al. 2022): RoPE kept, and rotary pair i of q and k scaled by zeta_i^(+-position /
    scale_base), zeta_i = (2i/d + gamma) / (1 + gamma), so scores decay with distance."""

    name: ClassVar[str] = "xpos"
    mechanisms: ClassVar[tuple[str, ...]] = ("rope",)
    summary: ClassVar[str] = "XPos: RoPE plus a per-dimension exponential decay with distance"
    contract: ClassVar[Contract] = Contract(
        examples=({},),
        refused=(Refused({"gamma": 0}, "gamma must be > 0"), Refused({"scale_base": 0.5}, "past the float range")),
        reference="tests/test_attention_methods.py::test_xpos_score_depends_only_on_the_distance",
    )
    removes_positions: ClassVar[bool] = False
    skipped_positions: ClassVar[str | None] = (
        "its decay counts distance by the order of the tokens inside attention while the rotation reads the "
        "position ids: skipped ids would train a decay that disagrees with the rotation")

    gamma: float = 0.4
    scale_base: float = 512.0

    # the largest exponent of the q / k scale at the advertised context: e^60 leaves q and k themselves
    # ~e^28 of room before float32 / bfloat16 overflow (e^88), where scores would become inf and NaN
    MAX_EXPONENT: ClassVar[float] = 60.0

    def __post_init__(self) -> None:
        super().__post_init__()
        check_number("gamma", self.gamma, above=0, optional=False)
        check_number("scale_base", self.scale_base, above=0, optional=False)

    def resolve(self, original: int) -> XposConfig:
        resolved = super().resolve(original)
        # positions count from the middle of the keys (methods/xpos.py): the scale reaches zeta_0^(-L / 2 scale_base)
        rate = abs(math.log(self.gamma / (1 + self.gamma)))
        exponent = rate * resolved.max_position_embeddings / (2 * self.scale_base)
        if not exponent <= self.MAX_EXPONENT:
            raise InvalidParameterError(
                f"xpos with gamma={self.gamma!r} and scale_base={self.scale_base!r} scales q and k by up to e^"
                f"{exponent:.3g} at {resolved.max_position_embeddings} tokens, past the float range (e^88): the scores "
                f"would be inf or NaN. Use scale_base >= {rate * resolved.max_position_embeddings / (2 * self.MAX_EXPONENT):.4g} "
                f"(or a larger gamma, or a shorter max_position_embeddings)"
            )
        return resolved

    def check_rope_model(self, config) -> None:
        if config.model_type in _compat.INTERLEAVED_ROTARY_MODEL_TYPES:
            raise MethodNotApplicableError(
                f"xpos scales rotary pairs in the rotate-half layout; {config.model_type} rotates interleaved pairs"
            )

    def attention_child(self, site: AttentionSite, module: nn.Module) -> nn.Module:
        scale = XposScale(_compat.head_dim(site.config), _compat.rotary_dim(site.config, None), self.gamma,
                          self.scale_base)
        return PositionalAttention(causal=module.is_causal, qk=scale, layout=site.layout)
