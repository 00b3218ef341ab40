"""Llama 3.1's RoPE scaling (Meta, 2024): wavelengths longer than original / low_freq_factor are divided
by s, shorter than original / high_freq_factor kept, a smooth ramp between."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ..config import Contract, Refused, RopeMethodConfig, check_number, register_method
from ..errors import InvalidParameterError


@register_method
@dataclass
class Llama3Config(RopeMethodConfig):
    """Llama 3.1's frequency-dependent scaling: long wavelengths / s, short ones kept, a smooth ramp between."""

    name: ClassVar[str] = "llama3"
    summary: ClassVar[str] = "Llama 3.1 scaling: low frequencies / s, high kept, smooth between"
    contract: ClassVar[Contract] = Contract(
        examples=({},),
        refused=(Refused({"factor": 2, "low_freq_factor": 4, "high_freq_factor": 1},
                         "high_freq_factor must be > low_freq_factor"),),
        reference="tests/test_rope_families.py::test_rotary_matches_transformers_and_the_paper_formula",
        factor_1_tolerance=1e-5,  # at factor 1 the ramp mixes inv_freq / 1 and inv_freq: rounding apart
        expected_rope_parameters=lambda theta, dim, original: {  # Llama 3.1's own low / high frequency factors
            "rope_type": "llama3", "factor": 2.0, "original_max_position_embeddings": original,
            "low_freq_factor": 1.0, "high_freq_factor": 4.0},
    )
    stock_checkpoint: ClassVar[bool] = True

    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0

    def __post_init__(self) -> None:
        super().__post_init__()
        check_number("low_freq_factor", self.low_freq_factor, above=0, optional=False)
        check_number("high_freq_factor", self.high_freq_factor, above=0, optional=False)
        if self.high_freq_factor <= self.low_freq_factor:
            raise InvalidParameterError(
                f"high_freq_factor must be > low_freq_factor, got high_freq_factor={self.high_freq_factor!r}, "
                f"low_freq_factor={self.low_freq_factor!r}"
            )

    def rope_parameters(self, base: dict, original: int, dim: int) -> dict:
        return base | {
            "rope_type": "llama3", "factor": self.factor, "original_max_position_embeddings": original,
            "low_freq_factor": self.low_freq_factor, "high_freq_factor": self.high_freq_factor,
        }
