"""What a family is: the interface every family adapter implements, the table of registered families, and the
lookup of a model's family. Below the families, the records (record.py names a family) and the patch calls."""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, ClassVar

from torch import nn
from transformers import PreTrainedConfig

from .errors import UnsupportedModelError
from .named import Registry

if TYPE_CHECKING:
    from .config import MethodConfig
    from .plan import PatchPlan
    from .record import PatchRecord

class Family(ABC):
    """Knows where one architecture family keeps its positions and how to swap them. Every caller (hp.patch,
    hp.from_pretrained, hp.describe, hp.check_length) goes through these members only."""

    name: str  # what a saved record calls the family
    mechanism: ClassVar[str]  # "rope" or "learned": the methods whose `mechanisms` name it apply
    model_types: tuple[str, ...]  # the model_types the test suite covers

    @abstractmethod
    def matches(self, model: nn.Module) -> bool:
        """The model keeps its positions where this family looks, or carries a patch this family made."""

    @abstractmethod
    def describe(self, model: nn.Module) -> dict:
        """`hp.describe`'s fields of the positional mechanism (mechanism, rope_theta, length_limit, ...)."""

    @abstractmethod
    def plan(self, model: nn.Module, method: MethodConfig) -> PatchPlan:
        """The whole patch as a plan, computed and checked before anything in the model changes."""

    @abstractmethod
    def unpatched_config(self, config, record: PatchRecord) -> tuple[PreTrainedConfig, tuple[str, ...]]:
        """For `hp.from_pretrained` of a patched checkpoint whose patch is replayed: the config of the model before
        the patch, from the saved `config`, and the saved tensors that do not fit that model (tables a patch
        emptied), which `restore_original` puts back."""

    def read_back(self, record: PatchRecord) -> tuple[str, ...]:
        """Suffixes of the tensors a checkpoint of `record`'s patch holds beside the model's own, which the stock
        load does not take and the family reads itself (so transformers' load report is not shown for them)."""
        return ()

    def rebuild_saved_patch(self, model: nn.Module, path, record: PatchRecord) -> bool:
        """For `hp.from_pretrained`, after stock transformers loaded `model` from `path` with `unpatched_config`'s
        config: where the checkpoint holds the patched modules themselves (a longer learned table), rebuild the
        patch `record` describes on them and return True; return False where the family replays the patch on the
        model before it instead (the default)."""
        return False

    def restore_original(self, model: nn.Module, path, record: PatchRecord) -> str | None:
        """After loading the model before the patch from `path` (`unpatched_config`): put back what the patch
        removed from the checkpoint. Returns why `hp.unpatch` must refuse when the checkpoint lacks it."""
        return None

    def check_length(self, model: nn.Module, length: int) -> None:
        """Refuse (SequenceTooLongError) an input of `length` tokens the model cannot take. No limit by default."""


FAMILIES = Registry("family", Family, setting="a saved record's family", decorator="register_family",
                    instances=True, pattern=r"[a-z][a-z0-9_\-]*")   # asked in this order: the first that matches


def register_family(family: Family) -> Family:
    """Put a family (an instance) in FAMILIES under its name; a name taken is refused, naming both."""
    return FAMILIES.register(family)


def supported_model_types() -> list[str]:
    return sorted({t for family in FAMILIES.values() for t in family.model_types})


def as_model(model, call: str) -> nn.Module:
    """The transformers model `call` works on: `model` itself, or the one a PEFT wrapper holds (LoRA layers
    sit inside it, so patching it patches what the wrapper runs). Anything else is refused."""
    if isinstance(model, nn.Module) and type(model).__module__.startswith("peft.") \
            and hasattr(model, "get_base_model"):
        model = model.get_base_model()
    if not isinstance(model, nn.Module) or not isinstance(getattr(model, "config", None), PreTrainedConfig):
        hint = (f"; a name or a path is loaded first: model = hp.load_model({model!r})"
                if isinstance(model, (str, os.PathLike)) else "")
        raise UnsupportedModelError(
            f"hp.{call} needs a transformers model (a torch.nn.Module with a transformers config, from "
            f"hp.load_model or AutoModel*.from_pretrained), got {type(model).__name__} {str(model)[:60]!r}{hint}"
        )
    return model


def find_family(model: nn.Module) -> Family:
    for family in FAMILIES.values():
        if family.matches(model):
            return family
    model_type = getattr(getattr(model, "config", None), "model_type", type(model).__name__)
    raise UnsupportedModelError(
        f"no positional module found in model_type {model_type!r} ({type(model).__name__}); hf_posenc supports "
        f"models with a rotary module built from their config or a learned position table. Tested families: "
        f"{', '.join(supported_model_types())}"
    )
