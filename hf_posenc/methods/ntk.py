"""NTK-aware scaling (bloc97, 2023): a larger RoPE base that stretches the lowest frequency by exactly the
factor s and the highest by ~1: theta' = theta * s^(d / (d - 2)), d the rotary dimension."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ..config import RopeMethodConfig
from .rope import ntk_theta


@dataclass
class NTKConfig(RopeMethodConfig):
    """NTK-aware static scaling: theta' = theta * s^(d / (d - 2)), d the rotary dimension."""

    name: ClassVar[str] = "ntk"
    summary: ClassVar[str] = "NTK-aware scaling: theta * s^(d/(d-2))"
    stock_checkpoint: ClassVar[bool] = True

    def rope_parameters(self, base: dict, original: int, dim: int) -> dict:
        return base | {"rope_theta": ntk_theta(base["rope_theta"], self.factor, dim)}
