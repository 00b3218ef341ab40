"""The lookups: every method and family, registered, by name. Importing this module imports every method module
(hf_posenc/methods/, each registers itself with `@register_method`) and every family adapter (hf_posenc/families/),
so what it returns is complete. Lookups that fail raise with the list of what exists."""

from __future__ import annotations

from typing import TYPE_CHECKING

from . import _compat, families, methods  # noqa: F401  (importing them registers every family and method)
from .config import METHODS, MethodConfig, register_method
from .errors import MethodNotApplicableError, RegistrationError, UnknownMethodError
from .methods.rope import CUSTOM_ROPE_TYPE_PREFIX
from .family import FAMILIES, Family, as_model, find_family, register_family, supported_model_types

if TYPE_CHECKING:
    from torch import nn

    from .plan import PatchPlan

__all__ = ["METHODS", "FAMILIES", "Family", "RegistrationError", "register_method", "register_family", "get_method",
           "methods_for", "supported_model_types", "as_model", "find_family", "plan_patch", "list_methods"]


def get_method(name: str) -> type[MethodConfig]:
    if not isinstance(name, str):
        raise UnknownMethodError(f"method must be a name or a method config, got {name!r}; known: {', '.join(METHODS)}")
    return METHODS.get(name)   # an unknown name: UnknownMethodError, the known ones listed, the closest suggested


def methods_for(mechanism: str) -> list[str]:
    return sorted(name for name, cls in METHODS.items() if mechanism in cls.mechanisms)


def plan_patch(model: nn.Module, method: MethodConfig) -> PatchPlan:
    """The plan of `method` on `model` from its family, refused before anything changes where the method does not
    apply to the model's positions. `hp.patch` applies it after its own checks (and a GGUF file's rope scaling on
    load, hf_posenc/loading.py)."""
    family = find_family(model)
    if family.mechanism not in method.mechanisms:
        raise MethodNotApplicableError(
            f"method {method.name!r} applies to {'/'.join(method.mechanisms)} positions, but this "
            f"{model.config.model_type} model uses {family.mechanism} positions; methods that apply: "
            f"{', '.join(methods_for(family.mechanism))}"
        )
    return family.plan(model, method)


def list_methods() -> list[dict]:
    """Every method: its name, the mechanisms it applies to, its parameters with their defaults."""
    return [
        {"name": name, "mechanisms": list(cls.mechanisms), "summary": cls.summary,
         "length_dependent": cls.length_dependent, "parameters": cls.parameters()}
        for name, cls in sorted(METHODS.items())
    ]

# transformers warns "Missing validation function" at every load and save of a config whose rope_type it does not
# know: hf_posenc's own markers (recorded by attention and length-following methods) get a validator, here, where
# every method is registered, so any path to a patch (hp.*, hf_posenc.api, loading) has it
_compat.register_custom_rope_types(CUSTOM_ROPE_TYPE_PREFIX + name for name in METHODS)
