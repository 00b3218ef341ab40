"""Method and family registries. Lookups that fail raise with the list of what exists."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Protocol

from torch import nn
from transformers import PreTrainedConfig

from . import config as _config
from .errors import UnknownMethodError, UnsupportedModelError
from .record import read_record

if TYPE_CHECKING:
    import torch

    from .plan import PatchPlan

METHODS: dict[str, type[_config.MethodConfig]] = {}
FAMILIES: list[Family] = []


class Family(Protocol):
    """Knows where one architecture family keeps its positions and how to swap them."""

    name: str
    mechanism: str
    model_types: tuple[str, ...]  # the model_types the test suite covers

    def matches(self, model: torch.nn.Module) -> bool: ...

    def describe(self, model: torch.nn.Module) -> dict: ...

    def plan(self, model: torch.nn.Module, method: _config.MethodConfig) -> PatchPlan: ...


def register_method(cls: type[_config.MethodConfig]) -> type[_config.MethodConfig]:
    METHODS[cls.name] = cls
    return cls


def register_family(family: Family) -> Family:
    FAMILIES.append(family)
    return family


def get_method(name: str) -> type[_config.MethodConfig]:
    if not isinstance(name, str):
        raise UnknownMethodError(f"method must be a name or a method config, got {name!r}; known: {sorted(METHODS)}")
    try:
        return METHODS[name]
    except KeyError:
        raise UnknownMethodError(f"unknown method {name!r}; known methods: {', '.join(sorted(METHODS))}") from None


def methods_for(mechanism: str) -> list[str]:
    return sorted(name for name, cls in METHODS.items() if mechanism in cls.mechanisms)


def supported_model_types() -> list[str]:
    return sorted({t for family in FAMILIES for t in family.model_types})


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


def find_family(model: torch.nn.Module) -> Family:
    for family in FAMILIES:
        if family.matches(model):
            return family
    record = read_record(getattr(model, "config", None))
    if record:  # a patch may have removed what the family looks for (ALiBi removes the rotary module)
        return record.family_adapter()
    model_type = getattr(getattr(model, "config", None), "model_type", type(model).__name__)
    raise UnsupportedModelError(
        f"no positional module found in model_type {model_type!r} ({type(model).__name__}); hf_posenc supports "
        f"models with a rotary module built from their config or a learned position table. Tested families: "
        f"{', '.join(supported_model_types())}"
    )


def list_methods() -> list[dict]:
    """Every method: its name, the mechanisms it applies to, its parameters with their defaults."""
    return [
        {"name": name, "mechanisms": list(cls.mechanisms), "summary": cls.summary,
         "length_dependent": cls.length_dependent, "parameters": cls.parameters()}
        for name, cls in sorted(METHODS.items())
    ]


# -- the methods: one module each (hf_posenc/methods/<name>.py); registering one is a line here -----------

from .methods.alibi import AlibiConfig  # noqa: E402
from .methods.base_frequency import BaseConfig  # noqa: E402
from .methods.dca import DcaConfig  # noqa: E402
from .methods.dynamic import DynamicConfig  # noqa: E402
from .methods.dynamic_yarn import DynamicYarnConfig  # noqa: E402
from .methods.hierarchical import HierarchicalConfig  # noqa: E402
from .methods.interpolate import InterpolateConfig  # noqa: E402
from .methods.linear import LinearConfig  # noqa: E402
from .methods.llama3 import Llama3Config  # noqa: E402
from .methods.longrope import LongRopeConfig  # noqa: E402
from .methods.ntk import NTKConfig  # noqa: E402
from .methods.relative_bias import RelativeBiasConfig  # noqa: E402
from .methods.rope_swap import RopeSwapConfig  # noqa: E402
from .methods.self_extend import SelfExtendConfig  # noqa: E402
from .methods.sinusoidal import SinusoidalConfig  # noqa: E402
from .methods.tile import TileConfig  # noqa: E402
from .methods.xpos import XposConfig  # noqa: E402
from .methods.yarn import YarnConfig  # noqa: E402

for _cls in (BaseConfig, NTKConfig, LinearConfig, DynamicConfig, YarnConfig, DynamicYarnConfig, Llama3Config,
             LongRopeConfig,  # RoPE scaling
             SinusoidalConfig, InterpolateConfig, TileConfig, HierarchicalConfig,  # learned tables
             AlibiConfig, RelativeBiasConfig, XposConfig, RopeSwapConfig, DcaConfig, SelfExtendConfig):  # attention
    register_method(_cls)
