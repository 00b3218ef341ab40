"""Dynamic YaRN: YaRN whose factor follows the input length, s = max(1, L / L0) up to the target factor, so
inputs inside the original context see the model exactly (the dynamic form of Peng et al. 2023's YaRN)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ..config import RopeMethodConfig, check_bool, check_number
from .rope import CUSTOM_ROPE_TYPE_PREFIX, optional_fields
from .yarn import check_betas


@dataclass
class DynamicYarnConfig(RopeMethodConfig):
    """YaRN whose factor follows the current length: s = max(1, L / L0), capped at the target factor;
    inputs up to L0 see the original model exactly."""

    name: ClassVar[str] = "dynamic_yarn"
    summary: ClassVar[str] = "YaRN with s = max(1, L / original), exact inside the original context"
    length_dependent: ClassVar[bool] = True

    beta_fast: float = 32.0
    beta_slow: float = 1.0
    mscale: float | None = None
    mscale_all_dim: float | None = None
    truncate: bool = True
    exact_cache: bool = False  # hf_posenc/methods/exact_cache.py: cached keys re-rotated at every step

    def __post_init__(self) -> None:
        super().__post_init__()
        check_betas(self.beta_fast, self.beta_slow)
        check_number("mscale", self.mscale, above=0)
        check_number("mscale_all_dim", self.mscale_all_dim, above=0)
        check_bool("truncate", self.truncate)
        check_bool("exact_cache", self.exact_cache)

    follows_length: ClassVar[bool] = True

    def rope_parameters(self, base: dict, original: int, dim: int) -> dict:
        return base | {"rope_type": CUSTOM_ROPE_TYPE_PREFIX + self.name, "factor": self.factor,
                       "original_max_position_embeddings": original}

    def parameters_at_length(self, base: dict, original: int, seq_len: int) -> dict:
        return base | {
            "rope_type": "yarn", "factor": seq_len / original, "original_max_position_embeddings": original,
            "beta_fast": self.beta_fast, "beta_slow": self.beta_slow, "truncate": self.truncate,
        } | optional_fields(self, "mscale", "mscale_all_dim")
