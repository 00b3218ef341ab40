"""Method and family registries. Lookups that fail raise with the list of what exists."""

from __future__ import annotations

import dataclasses
import os
from typing import TYPE_CHECKING, Protocol

from torch import nn
from transformers import PreTrainedConfig

from . import config as _config
from .errors import CheckpointRecordError, PosEncError, UnknownMethodError, UnsupportedModelError
from .plan import RECORD_ATTR

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
        return next(f for f in FAMILIES if f.name == record["family"])
    model_type = getattr(getattr(model, "config", None), "model_type", type(model).__name__)
    raise UnsupportedModelError(
        f"no positional module found in model_type {model_type!r} ({type(model).__name__}); hf_posenc supports "
        f"models with a rotary module built from their config or a learned position table. Tested families: "
        f"{', '.join(supported_model_types())}"
    )


def read_record(config, source: str | None = None) -> dict | None:
    """The hf_posenc record a config carries (None when it carries none), checked: every reader of a
    record goes through here, so one that is malformed (not a dict, a key missing, an unknown family or
    method, parameters of the wrong type) is refused the same way everywhere, naming `source` (the
    config.json it came from; by default the model's own name)."""
    record = getattr(config, RECORD_ATTR, None) if config is not None else None
    if record is None:
        return None
    if source is None:
        name = getattr(config, "_name_or_path", "")
        source = f"{name}/config.json" if name else "this model's config"
    _check_record(record, source, RECORD_ATTR)
    return record


def _check_record(record, source: str, field: str) -> None:
    def refuse(what: str):
        raise CheckpointRecordError(
            f"{source}: its {field!r} record {what}. hf_posenc writes that record when it saves a patched model "
            f"and restores the patch from it; this one was edited or written by hand. Save the model again from "
            f"the patched one, or delete the field to load the checkpoint as stock transformers reads it"
        )

    if not isinstance(record, dict):
        refuse(f"must be a dict, got {type(record).__name__} {str(record)[:80]!r}")
    missing = [key for key in ("family", "mechanism", "method", "params", "original") if key not in record]
    if missing:
        refuse(f"lacks the key(s) {missing}")
    family = next((f for f in FAMILIES if f.name == record["family"]), None)
    if family is None:
        refuse(f"names an unknown family {record['family']!r}; known: {', '.join(f.name for f in FAMILIES)}")
    if record["mechanism"] != family.mechanism:
        refuse(f"says mechanism {record['mechanism']!r}, but family {family.name!r} has {family.mechanism!r} positions")
    method = METHODS.get(record["method"]) if isinstance(record["method"], str) else None
    if method is None:
        refuse(f"names an unknown method {record['method']!r}; known: {', '.join(sorted(METHODS))}")
    if family.mechanism not in method.mechanisms:
        refuse(f"names method {method.name!r}, which does not apply to {family.mechanism} positions")
    params = record["params"]
    if not isinstance(params, dict):
        refuse(f"has params {params!r}, not a dict")
    names = {f.name for f in dataclasses.fields(method)}
    try:
        method.from_dict({k: v for k, v in params.items() if k in names})
    except PosEncError as err:
        refuse(f"has parameters method {method.name!r} refuses ({err})")
    original = record["original"]
    if not isinstance(original, dict) or not _is_count(original.get("max_position_embeddings")):
        refuse(f"has 'original' {original!r}, which needs the original max_position_embeddings (an int > 0)")
    if family.mechanism == "rope" and not isinstance(original.get("rope_parameters"), dict):
        refuse(f"has 'original' {original!r}, which needs the original rope_parameters (a dict)")
    if family.mechanism == "learned" and not (isinstance(record.get("tables"), dict)
                                              and all(isinstance(t, dict) for t in record["tables"].values())):
        refuse(f"has 'tables' {record.get('tables')!r}, not a dict of the position tables it replaced")
    if "base" in record:  # the patch this one is stacked on (a RoPE method on a learned -> rope swap)
        _check_record(record["base"], source, f"{field}.base")


def _is_count(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def list_methods() -> list[dict]:
    """Every method: its name, the mechanisms it applies to, its parameters with their defaults."""
    return [
        {"name": name, "mechanisms": list(cls.mechanisms), "summary": cls.summary,
         "length_dependent": cls.length_dependent, "parameters": cls.parameters()}
        for name, cls in sorted(METHODS.items())
    ]


for _cls in _config.ROPE_METHOD_CONFIGS + _config.LEARNED_METHOD_CONFIGS + _config.ATTENTION_METHOD_CONFIGS:
    register_method(_cls)

# methods whose config and computation live in one module
from .methods.dca import DcaConfig  # noqa: E402
from .methods.self_extend import SelfExtendConfig  # noqa: E402

register_method(DcaConfig)
register_method(SelfExtendConfig)
