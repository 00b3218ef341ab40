"""Position interpolation (Chen et al. 2023, "Extending Context Window of Large Language Models via
Positional Interpolation"): position m rotates as m / s, so the target context maps onto the trained one."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ..config import Contract, Refused, RopeMethodConfig, register_method


@register_method
@dataclass
class LinearConfig(RopeMethodConfig):
    """Position interpolation (Chen et al. 2023): positions divided by the factor."""

    name: ClassVar[str] = "linear"
    summary: ClassVar[str] = "position interpolation (PI): positions / s"
    contract: ClassVar[Contract] = Contract(
        examples=({},),
        refused=(Refused({"factor": -1}, "factor must be > 0"),),
        reference="tests/test_rope_families.py::test_rotary_matches_transformers_and_the_paper_formula",
        expected_rope_parameters=lambda theta, dim, original: {"rope_type": "linear", "factor": 2.0},
    )
    stock_checkpoint: ClassVar[bool] = True

    def rope_parameters(self, base: dict, original: int, dim: int) -> dict:
        return base | {"rope_type": "linear", "factor": self.factor}
