"""What the methods whose frequencies hf_posenc sets for each input length share (dynamic.py, dynamic_yarn.py):
the rope_type a saved config records, `exact_cache` (exact_cache.py) and why engines cannot run them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from torch import nn

from ..config import RopeMethodConfig, check_bool
from .exact_cache import plan_exact_cache
from .rope import CUSTOM_ROPE_TYPE_PREFIX

if TYPE_CHECKING:
    from ..plan import PatchPlan


@dataclass
class LengthFollowingConfig(RopeMethodConfig):
    """What the methods whose frequencies hf_posenc sets for each input length share (dynamic, dynamic_yarn):
    a saved config records a rope_type stock transformers refuses, and `exact_cache` (exact_cache.py) re-rotates
    the cached keys at every step. Subclasses give `parameters_at_length`."""

    length_dependent: ClassVar[bool] = True
    follows_length: ClassVar[bool] = True
    skipped_positions: ClassVar[str | None] = (
        "its rotation is set by the largest position id of the input, so each skipped window would train the "
        "rotation of a random length, not the one generation uses; train its static counterpart (yarn, ntk) "
        "with position ids, or this method on contiguous windows")

    export_refusal: ClassVar[str | None] = "its frequencies follow the input length, which engines compute otherwise"

    exact_cache: bool = False  # hf_posenc/methods/exact_cache.py: cached keys re-rotated at every step

    def __post_init__(self) -> None:
        super().__post_init__()
        check_bool("exact_cache", self.exact_cache)

    def finish_plan(self, plan: PatchPlan, model: nn.Module, new_config, layer_types: list[str | None]) -> None:
        if self.exact_cache:
            plan_exact_cache(plan, model, new_config, layer_types)

    def rope_parameters(self, base: dict, original: int, dim: int) -> dict:
        return base | {"rope_type": CUSTOM_ROPE_TYPE_PREFIX + self.name, "factor": self.factor,
                       "original_max_position_embeddings": original}
