"""LongRoPE (Ding et al. 2024, "LongRoPE: Extending LLM Context Window Beyond 2 Million Tokens"): one
rescale factor per rotary pair, found by search, a long set past the original context and a short set inside
it; transformers' own rotary module switches between them by input length."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ..config import Contract, MAX_POSITIONS, Refused, RopeMethodConfig, check_number, register_method
from ..errors import InvalidParameterError, ParameterTypeError
from .rope import optional_fields


@register_method
@dataclass
class LongRopeConfig(RopeMethodConfig):
    """LongRoPE (Ding et al. 2024): one rescale factor per frequency, `long_factor` past the original
    context and `short_factor` (default all 1) inside it; one value per rotary pair (d/2 values)."""

    name: ClassVar[str] = "longrope"
    summary: ClassVar[str] = "LongRoPE: per-frequency factors, short and long sets"
    contract: ClassVar[Contract] = Contract(
        examples=({},),  # long_factor: a ramp from 1 to s over the model's rotary pairs
        refused=(Refused({"factor": 2}, "needs long_factor="),
                 Refused({"factor": 2, "long_factor": [1.0, 2.0]}, "long_factor has 2 values")),
        reference="tests/test_rope_families.py::test_rotary_matches_transformers_and_the_paper_formula",
        expected_rope_parameters=lambda theta, dim, original: {  # the example's ramp, 1 to 2 over the d/2 pairs
            "rope_type": "longrope", "factor": 2.0, "original_max_position_embeddings": original,
            "long_factor": [round(1 + i / (dim // 2 - 1), 4) for i in range(dim // 2)],
            "short_factor": [1.0] * (dim // 2)},
    )
    stock_checkpoint: ClassVar[bool] = True
    length_dependent: ClassVar[bool] = True  # switches between the two sets with the input length

    long_factor: list[float] | None = None
    short_factor: list[float] | None = None
    attention_factor: float | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("long_factor", "short_factor"):
            value = getattr(self, name)
            if value is None:
                continue
            if isinstance(value, (str, bytes, dict, set)) or not hasattr(value, "__iter__"):
                raise ParameterTypeError(f"{name} must be a list of numbers, got {value!r}")
            value = [float(v) if not isinstance(v, bool) and isinstance(v, (int, float)) else v for v in value]
            for i, v in enumerate(value):  # bounded as `factor` is: no pair stretched past MAX_POSITIONS
                check_number(f"{name}[{i}]", v, above=0, maximum=MAX_POSITIONS, optional=False)
            setattr(self, name, value)
        check_number("attention_factor", self.attention_factor, above=0)

    def resolve(self, original: int) -> LongRopeConfig:
        """As every method, and no per-pair factor may stretch a wavelength past what `factor` may: a factor
        f on a pair means positions up to original * f, which must stay <= MAX_POSITIONS."""
        resolved = super().resolve(original)
        for name in ("long_factor", "short_factor"):
            for i, v in enumerate(getattr(resolved, name) or []):
                if original * v > MAX_POSITIONS:
                    raise InvalidParameterError(
                        f"{name}[{i}]={v!r} stretches that pair to {original * v:.3g} positions (the original "
                        f"{original} times the factor); it must be <= {MAX_POSITIONS}, so each factor <= "
                        f"{MAX_POSITIONS / original:.6g}")
        return resolved

    def check_rotary(self, dim: int) -> None:
        half_dim = dim // 2
        if self.long_factor is None:
            raise InvalidParameterError(
                f"method 'longrope' needs long_factor= (a list of {half_dim} numbers, one per rotary pair)"
            )
        for name in ("long_factor", "short_factor"):
            value = getattr(self, name)
            if value is not None and len(value) != half_dim:
                raise InvalidParameterError(
                    f"{name} has {len(value)} values; this model's rotary dimension needs exactly {half_dim} "
                    f"(one per rotary pair, head_dim * partial_rotary_factor / 2)"
                )

    def rope_parameters(self, base: dict, original: int, dim: int) -> dict:
        out = base | {
            "rope_type": "longrope", "factor": self.factor, "original_max_position_embeddings": original,
            "long_factor": list(self.long_factor), "short_factor": list(self.short_factor or [1.0] * (dim // 2)),
        } | optional_fields(self, "attention_factor")
        if self.attention_factor is not None:
            # vLLM reads LongRoPE's scale from these two keys only, never attention_factor (without them it applies
            # sqrt(1 + ln s / ln L), transformers' default): written so a saved folder serves the scale it was run with
            out |= {"short_mscale": self.attention_factor, "long_mscale": self.attention_factor}
        return out

    @classmethod
    def variant_defaults(cls, params: dict, target: int, info: dict) -> dict:
        """Without searched factors at hand: per-pair factors ramped from 1 (the fastest pair) to s (the slowest)."""
        out = super().variant_defaults(params, target, info)
        if "long_factor" not in params:
            factor, half = target / info["max_position_embeddings"], info["rotary_dim"] // 2
            out["long_factor"] = [round(1 + (factor - 1) * i / (half - 1), 4) for i in range(half)]
        return out
