"""Adjusted base frequency (ABF: Xiong et al. 2023, "Effective Long-Context Scaling of Foundation Models";
Code Llama): RoPE with a larger rope_theta, theta_i = theta'^(-2i/d), every frequency lowered."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import ClassVar

from ..config import Contract, Refused, RopeMethodConfig, check_number, register_method
from ..errors import InvalidParameterError


@register_method
@dataclass
class BaseConfig(RopeMethodConfig):
    """Adjusted base frequency (ABF, Code Llama): a new rope_theta, given as theta= or as factor= times
    the old one. Here `factor` multiplies the base, not the context; max_position_embeddings
    (default: unchanged) only sets the advertised context."""

    name: ClassVar[str] = "base"
    summary: ClassVar[str] = "new rope_theta (adjusted base frequency), theta= or factor= times the old base"
    contract: ClassVar[Contract] = Contract(
        examples=({}, {"theta": 50000.0}),
        refused=(Refused({"theta": 0}, "theta must be > 0"),
                 Refused({"theta": 50000.0, "factor": 3.0}, "disagree")),
        reference="tests/test_rope_families.py::test_rotary_matches_transformers_and_the_paper_formula",
        # without theta= or factor=, an evaluation variant's base is NTK's for its target: theta * 2^(d/(d-2))
        expected_rope_parameters=lambda theta, dim, original: {
            "rope_type": "default", "rope_theta": theta * 2.0 ** (dim / (dim - 2))},
    )
    stock_checkpoint: ClassVar[bool] = True
    needs_target: ClassVar[bool] = False  # theta= alone says what it does (resolve: the context stays the original)

    theta: float | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        check_number("theta", self.theta, above=0)

    def resolve_theta(self, old_theta: float) -> float:
        if self.theta is None and self.factor is None:
            raise InvalidParameterError("method 'base' needs theta= (the new rope_theta, > 0) or factor= (> 0)")
        if self.theta is not None and self.factor is not None and not math.isclose(self.theta, old_theta * self.factor):
            raise InvalidParameterError(
                f"theta={self.theta!r} and factor={self.factor!r} disagree: the model's rope_theta is {old_theta!r}, "
                f"so factor={self.factor!r} means theta={old_theta * self.factor!r}; give one of them"
            )
        return float(self.theta if self.theta is not None else old_theta * self.factor)

    def resolve(self, original: int) -> BaseConfig:
        target = self.max_position_embeddings
        if target is not None and target < original:
            raise InvalidParameterError(
                f"max_position_embeddings={target} is shorter than the model's original context {original}; "
                f"it must be >= {original}"
            )
        return dataclasses.replace(self, max_position_embeddings=int(target or original))

    def rope_parameters(self, base: dict, original: int, dim: int) -> dict:
        return base | {"rope_theta": self.resolve_theta(base["rope_theta"])}

    @classmethod
    def variant_defaults(cls, params: dict, target: int, info: dict) -> dict:
        """Without theta= or factor=, the NTK amount for the target: theta * s^(d/(d-2)). `factor` is the
        base's factor here, so the target context always comes from max_position_embeddings."""
        out = dict(params)
        out.setdefault("max_position_embeddings", target)
        if "theta" not in params and "factor" not in params:
            dim = info["rotary_dim"]
            out["factor"] = (target / info["max_position_embeddings"]) ** (dim / (dim - 2))
        return out
