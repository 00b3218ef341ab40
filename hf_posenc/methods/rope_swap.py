"""Rotary positions (Su et al. 2021, "RoFormer") in place of a learned position table: the table removed,
q and k of every layer rotated inside attention by transformers' own rotary module, built from the
rope_parameters this method writes into the config. The model is a RoPE model from then on, so every RoPE
scaling method applies to it afterwards."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from torch import nn

from .. import _compat
from ..attention import AttentionMethodConfig, AttentionSite, PositionalAttention
from ..config import Contract, Refused, check_number, register_method
from ..errors import InvalidParameterError
from .rope import RotaryQK


@register_method
@dataclass
class RopeSwapConfig(AttentionMethodConfig):
    """Rotary positions in place of a learned table: q and k of every layer rotated (RoPE, base
    `theta`), on the first `partial_rotary_factor` of each head's channels. The model becomes a RoPE
    model: every RoPE scaling method applies to it afterwards."""

    name: ClassVar[str] = "rope"
    mechanisms: ClassVar[tuple[str, ...]] = ("learned",)
    summary: ClassVar[str] = "learned table removed, rotary q/k rotation (base theta) in its place"
    contract: ClassVar[Contract] = Contract(
        examples=({}, {"theta": 100.0, "partial_rotary_factor": 0.5}),
        refused=(Refused({"theta": 1}, "theta must be > 1"),
                 Refused({"partial_rotary_factor": 1.5}, "partial_rotary_factor is the share"),
                 Refused({"partial_rotary_factor": 0.05}, "rotary channels come in pairs")),
        reference="tests/test_attention_methods.py::test_swapped_rope_score_depends_only_on_the_distance",
    )

    theta: float = 10000.0
    partial_rotary_factor: float = 1.0

    def __post_init__(self) -> None:
        super().__post_init__()
        check_number("theta", self.theta, above=1, optional=False)
        check_number("partial_rotary_factor", self.partial_rotary_factor, above=0, optional=False)
        if self.partial_rotary_factor > 1:
            raise InvalidParameterError(
                f"partial_rotary_factor is the share of each head's channels that rotate, in (0, 1]; "
                f"got {self.partial_rotary_factor!r}"
            )

    writes_rope_parameters: ClassVar[bool] = True
    skipped_positions: ClassVar[str | None] = None   # the rotation reads the position ids, as any RoPE model's

    def learned_rotary(self, new_config, device) -> nn.Module:
        _check_rotary_dim(self, _compat.head_dim(new_config))
        new_config.rope_parameters = {"rope_type": "default", "rope_theta": self.theta,
                                      "partial_rotary_factor": self.partial_rotary_factor}
        return _compat.build_rotary(_compat.GENERIC_ROTARY, new_config, device)

    def attention_child(self, site: AttentionSite, module: nn.Module) -> nn.Module:
        return PositionalAttention(causal=module.is_causal, qk=RotaryQK(site.rotary), layout=site.layout)


def _check_rotary_dim(method: RopeSwapConfig, head_dim: int) -> None:
    """Rotary channels come in pairs: the share of each head that rotates must hold at least one pair, and
    whole pairs (transformers' rotary module takes int(head_dim * partial_rotary_factor) channels)."""
    dim = int(head_dim * method.partial_rotary_factor)
    if dim < 2 or dim % 2:
        raise InvalidParameterError(
            f"partial_rotary_factor={method.partial_rotary_factor!r} gives int({head_dim} * "
            f"{method.partial_rotary_factor!r}) = {dim} rotary channels per head of {head_dim}; rotary channels come "
            f"in pairs, so it must give an even number >= 2: the smallest partial_rotary_factor is "
            f"2/{head_dim} = {2 / head_dim:g}"
        )
