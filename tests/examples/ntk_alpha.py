"""NTK-aware scaling at a fixed alpha (bloc97 2023): theta' = theta * alpha^(d/(d-2)), d the rotary dimension,
whatever the target context."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from hf_posenc.config import Contract, Refused, RopeMethodConfig, check_number, register_method
from hf_posenc.methods.rope import ntk_theta


@register_method
@dataclass
class NtkAlphaConfig(RopeMethodConfig):
    """NTK-aware scaling at a fixed alpha: theta' = theta * alpha^(d/(d-2))."""

    name: ClassVar[str] = "ntk_alpha"
    summary: ClassVar[str] = "NTK-aware base at a fixed alpha"
    stock_checkpoint: ClassVar[bool] = True  # transformers builds it from the rope_parameters below
    needs_target: ClassVar[bool] = False  # alpha alone sets theta: hp.patch(model, "ntk_alpha", alpha=4) is enough
    contract: ClassVar[Contract] = Contract(  # what the suite runs it with (docs/ARCHITECTURE.md)
        examples=({"alpha": 2.0}, {"alpha": 4.0}),
        refused=(Refused({"alpha": 0}, "alpha must be > 1"),),
        reference="tests/test_examples.py::test_ntk_alpha_theta_is_the_papers",
        unpatched_at_factor_1=False,  # alpha changes theta at any target context
        expected_rope_parameters=lambda theta, dim, original: {  # the first example, alpha 2
            "rope_type": "default", "rope_theta": theta * 2.0 ** (dim / (dim - 2))},
    )

    alpha: float = 2.0

    def __post_init__(self) -> None:
        super().__post_init__()
        check_number("alpha", self.alpha, above=1, optional=False)

    def rope_parameters(self, base: dict, original: int, dim: int) -> dict:
        return base | {"rope_theta": ntk_theta(base["rope_theta"], self.alpha, dim)}
