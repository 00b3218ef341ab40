"""Dynamic YaRN: YaRN whose factor follows the input length, s = max(1, L / L0) up to the target factor, so
inputs inside the original context see the model exactly (the dynamic form of Peng et al. 2023's YaRN)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ..config import Contract, Refused, register_method
from .length_following import LengthFollowingConfig
from .yarn import check_truncate_layer_types, check_yarn_fields, yarn_parameters


@register_method
@dataclass
class DynamicYarnConfig(LengthFollowingConfig):
    """YaRN whose factor follows the current length: s = max(1, L / L0), capped at the target factor;
    inputs up to L0 see the original model exactly."""

    name: ClassVar[str] = "dynamic_yarn"
    summary: ClassVar[str] = "YaRN with s = max(1, L / original), exact inside the original context"
    contract: ClassVar[Contract] = Contract(
        examples=({}, {"exact_cache": True}),
        refused=(Refused({"factor": 2, "beta_slow": 0}, "beta_slow must be > 0"),),
        unchanged_within=1.0,
        reference="tests/test_rope.py::test_dynamic_yarn_at_length_L_is_yarn_with_factor_L_over_original",
    )
    export_refusal: ClassVar[str] = "no engine implements YaRN that follows the input length"

    beta_fast: float = 32.0
    beta_slow: float = 1.0
    mscale: float | None = None
    mscale_all_dim: float | None = None
    truncate: bool = True

    def __post_init__(self) -> None:
        super().__post_init__()
        check_yarn_fields(self)

    def parameters_at_length(self, base: dict, original: int, seq_len: int) -> dict:
        return yarn_parameters(self, base, original, seq_len / original, ("mscale", "mscale_all_dim"))

    def check_layer_types(self, config, layer_types: list[str | None]) -> None:
        check_truncate_layer_types(self, config, layer_types)
