"""The variants an evaluation compares: "none" (the model as loaded) or a method with parameters,
written as text so configs and the command line can list them: "yarn", "yarn beta_fast=16 mscale=1",
"longrope long_factor=[1,1.5,2]" (values are JSON when they parse). A grid lists several values of
each parameter: "yarn beta_fast=16|32 mscale=1|1.1" (`expand_grid`)."""

from __future__ import annotations

import contextlib
import itertools

import torch

from .. import api
from ..config import METHODS
from ..named import parse_params
from ..errors import InvalidParameterError
from ..registry import get_method

NONE = "none"


def parse_variant(spec: str) -> tuple[str, dict]:
    """'yarn beta_fast=16' -> ('yarn', {'beta_fast': 16}); the method name and the parameters given are
    checked (before any model is loaded)."""
    if not isinstance(spec, str) or not spec.split():
        raise InvalidParameterError(f"a variant is 'none' or a method with key=value parameters ('yarn beta_fast=16'), "
                                    f"got {spec!r}")
    name = spec.split()[0]
    if name != NONE:
        name, params = METHODS.parse(spec)   # an unknown method refused, the known ones listed
    else:
        try:
            params = parse_params(spec.split()[1:])
        except InvalidParameterError as err:
            raise InvalidParameterError(f"variant {spec!r}: {err}") from None
    if name == NONE and params:
        raise InvalidParameterError(f"variant {spec!r}: 'none' (the unpatched model) takes no parameters")
    if name != NONE:
        get_method(name).from_dict(params)
    return name, params


def expand_grid(spec: str) -> list[str]:
    """A grid of one method's parameters, values separated by "|", as the variants of its points:
    "yarn beta_fast=16|32 mscale=1|1.1" -> ["yarn beta_fast=16 mscale=1", "yarn beta_fast=16 mscale=1.1",
    "yarn beta_fast=32 mscale=1", "yarn beta_fast=32 mscale=1.1"]. Each point is checked as a variant."""
    if not isinstance(spec, str) or not spec.split():
        raise InvalidParameterError(f"a grid is a method with key=value|value parameters ('yarn beta_fast=16|32'), "
                                    f"got {spec!r}")
    name, *pairs = spec.split()
    if name == NONE:
        raise InvalidParameterError(f"grid {spec!r}: 'none' has no parameters to search")
    axes = []
    for pair in pairs:
        key, sep, values = pair.partition("=")
        if not sep or not key or "" in values.split("|"):
            raise InvalidParameterError(f"grid {spec!r}: parameters are key=value or key=value|value|..., got {pair!r}")
        axes.append([f"{key}={value}" for value in values.split("|")])
    points = [" ".join([name, *point]) for point in itertools.product(*axes)]
    for point in points:
        parse_variant(point)
    return points


def variant_params(model: torch.nn.Module, method: str, params: dict, target: int) -> dict:
    """The parameters a variant runs with at a target context of `target` tokens: the method's own defaults
    for a target (`MethodConfig.variant_defaults`: the target context, unless the variant gave its own
    max_position_embeddings= or factor=; `base` the NTK amount, `longrope` a ramp of per-pair factors,
    `self_extend` the group the variant gives)."""
    return get_method(method).variant_defaults(params, target, api.describe(model))


@contextlib.contextmanager
def variant(model: torch.nn.Module, spec: str, target: int):
    """`hp.patched` for a variant: the model patched as `spec` says for `target` tokens (`variant_params`)
    inside the block, unpatched after it; yields the parameters used ({} for "none")."""
    method, params = parse_variant(spec)
    if method == NONE:
        yield {}
        return
    params = variant_params(model, method, params, target)
    with api.patched(model, method, **params):
        yield params
