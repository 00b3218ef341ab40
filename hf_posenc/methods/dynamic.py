"""Dynamic NTK scaling (emozilla, 2023): the NTK base grows with the current input length, so inputs
inside the original context see the model unchanged."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ..config import RopeMethodConfig, check_bool
from .rope import CUSTOM_ROPE_TYPE_PREFIX


@dataclass
class DynamicConfig(RopeMethodConfig):
    """Dynamic NTK: the base grows with the current length L past the *original* context L0,
    theta' = theta * (s * L / L0 - (s - 1))^(d / (d - 2)) with L capped at the target context;
    inputs up to L0 see the original model, factor 1 is the original model."""

    name: ClassVar[str] = "dynamic"
    summary: ClassVar[str] = "dynamic NTK, measured from the original context"
    length_dependent: ClassVar[bool] = True

    exact_cache: bool = False  # hf_posenc/methods/exact_cache.py: cached keys re-rotated at every step

    def __post_init__(self) -> None:
        super().__post_init__()
        check_bool("exact_cache", self.exact_cache)

    follows_length: ClassVar[bool] = True

    def rope_parameters(self, base: dict, original: int, dim: int) -> dict:
        return base | {"rope_type": CUSTOM_ROPE_TYPE_PREFIX + self.name, "factor": self.factor,
                       "original_max_position_embeddings": original}

    def parameters_at_length(self, base: dict, original: int, seq_len: int) -> dict:
        # transformers' "dynamic" formula, read against the original context (the scratch config that
        # evaluates it keeps max_position_embeddings = original)
        return base | {"rope_type": "dynamic", "factor": self.factor}
