"""The model `train.objective: distill` matches (`train.teacher`).

    unpatched      the model as loaded, at its own positions: the student is held to it inside the original
                   context (the default; the windows stay within it)
    self_extend    the same weights with Self-Extend (Jin et al. 2024) to the patched context, which recalls
                   far tokens without training: the student is held to it at the training window's ids, a
                   PoSE window's spread ids included (Self-Extend reads them: hf_posenc/methods/self_extend.py).
                   Parameters as the method's: "self_extend group_size=5 window=2048" (default: the smallest
                   group that reaches the patched context, the window a quarter of the original)

A teacher is a frozen copy of the loaded weights, patched before the student is: the student's own patch
(posenc) never reaches it.
"""

from __future__ import annotations

import copy
from ..named import parse_params
from ..errors import ConfigError, PosEncError
from ..errors import one_line

TEACHERS = ("unpatched", "self_extend")


def parse(spec: str) -> tuple[str, dict]:
    """("self_extend", {"group_size": 5}) from "self_extend group_size=5"; refused in one line naming train.teacher."""
    if not isinstance(spec, str) or not spec.split():
        raise ConfigError(f"train.teacher must be one of {', '.join(TEACHERS)} (with key=value parameters for "
                          f"self_extend), got {spec!r}")
    name, *pairs = spec.split()
    if name not in TEACHERS:
        raise ConfigError(f"train.teacher={spec!r}: unknown teacher {name!r}; known: {', '.join(TEACHERS)}")
    try:
        params = parse_params(pairs)
    except PosEncError as err:
        raise ConfigError(f"train.teacher={spec!r}: {err}") from None
    if name == "unpatched" and params:
        raise ConfigError(f"train.teacher={spec!r}: the unpatched teacher takes no parameters")
    for key in ("max_position_embeddings", "factor"):
        if key in params:
            raise ConfigError(f"train.teacher={spec!r}: the teacher's context is the patched one (posenc); give "
                              f"group_size= / window= only")
    return name, params


def reads_position_ids(spec: str) -> bool:
    """Whether the teacher reads a window's spread ids (a position scheme can train against it)."""
    return parse(spec)[0] != "unpatched"


def patch(teacher, spec: str, target: int):
    """`teacher` (a copy of the loaded model) as train.teacher makes it, patched to `target` positions; a patch
    the model cannot take (learned tables, an encoder, a sliding window, a longrope checkpoint) refused in one line
    naming train.teacher."""
    name, params = parse(spec)
    if name == "unpatched":
        return teacher
    from .. import api

    try:
        return api.patch(teacher, name, max_position_embeddings=target, **params)
    except PosEncError as err:
        raise ConfigError(f"train.teacher={spec!r} cannot be this model patched to {target} positions: "
                          f"{one_line(err)}") from None


def check(spec: str, skeleton, target: int, ref: str) -> None:
    """Preflight: the teacher patched on a copy of the model's unpatched skeleton (meta device)."""
    if parse(spec)[0] == "unpatched":
        return
    try:
        patch(copy.deepcopy(skeleton), spec, target)
    except ConfigError as err:
        raise ConfigError(f"{err} (model {ref!r})") from None


def build(model, spec: str, target: int, device):
    """The frozen teacher: a copy of `model` (loaded, not yet patched), patched as train.teacher says."""
    teacher = copy.deepcopy(model).eval().requires_grad_(False)
    return patch(teacher, spec, target).to(device)
