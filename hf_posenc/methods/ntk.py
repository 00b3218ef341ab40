"""NTK-aware scaling (bloc97, 2023): a larger RoPE base that stretches the lowest frequency by exactly the
factor s and the highest by ~1: theta' = theta * s^(d / (d - 2)), d the rotary dimension."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ..config import Contract, Refused, RopeMethodConfig, register_method
from .rope import ntk_theta


@register_method
@dataclass
class NTKConfig(RopeMethodConfig):
    """NTK-aware static scaling: theta' = theta * s^(d / (d - 2)), d the rotary dimension."""

    name: ClassVar[str] = "ntk"
    summary: ClassVar[str] = "NTK-aware scaling: theta * s^(d/(d-2))"
    contract: ClassVar[Contract] = Contract(
        examples=({},),
        refused=(Refused({"factor": 0.5}, "factor must be >= 1"),
                 Refused({"max_position_embeddings": 32}, "shorter than the model's original context")),
        reference="tests/test_rope_families.py::test_rotary_matches_transformers_and_the_paper_formula",
        expected_rope_parameters=lambda theta, dim, original: {  # theta * s^(d/(d-2)), s = 2
            "rope_type": "default", "rope_theta": theta * 2.0 ** (dim / (dim - 2))},
    )
    stock_checkpoint: ClassVar[bool] = True

    def rope_parameters(self, base: dict, original: int, dim: int) -> dict:
        return base | {"rope_theta": ntk_theta(base["rope_theta"], self.factor, dim)}
