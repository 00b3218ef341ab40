"""Dynamic NTK scaling (emozilla, 2023): the NTK base grows with the current input length, so inputs
inside the original context see the model unchanged."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ..config import Contract, Refused, register_method
from .length_following import LengthFollowingConfig


@register_method
@dataclass
class DynamicConfig(LengthFollowingConfig):
    """Dynamic NTK: the base grows with the current length L past the *original* context L0,
    theta' = theta * (s * L / L0 - (s - 1))^(d / (d - 2)) with L capped at the target context;
    inputs up to L0 see the original model, factor 1 is the original model."""

    name: ClassVar[str] = "dynamic"
    summary: ClassVar[str] = "dynamic NTK, measured from the original context"
    contract: ClassVar[Contract] = Contract(
        examples=({}, {"exact_cache": True}),
        refused=(Refused({"factor": 2, "exact_cache": 1}, "exact_cache must be a bool"),
                 Refused({}, "needs max_position_embeddings=")),
        unchanged_within=1.0,
        reference="tests/test_rope.py::test_dynamic_measures_from_the_original_context",
    )
    export_refusal: ClassVar[str] = (
        "its scaling follows the input length from the original context; engines' own 'dynamic' measures from "
        "max_position_embeddings, so it would scale differently")

    def parameters_at_length(self, base: dict, original: int, seq_len: int) -> dict:
        # transformers' "dynamic" formula, read against the original context (the scratch config that
        # evaluates it keeps max_position_embeddings = original)
        return base | {"rope_type": "dynamic", "factor": self.factor}
