"""What the plots need to know about a model: its mechanism, its original and current context, and
a temporary patch that is always undone."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from .. import api
from ..config import MethodConfig
from ..errors import AlreadyPatchedError
from ..plan import is_patched
from ..record import read_record
from ..registry import find_family


def mechanism(model: torch.nn.Module) -> str:
    """"rope" or "learned" (a position table added to the input, learned or sinusoidal)."""
    return find_family(model).mechanism


def contexts(model: torch.nn.Module) -> tuple[int, int]:
    """(original context, current context) in positions: the context the checkpoint was trained at,
    and the one it advertises now (the target of a patch)."""
    family = find_family(model)
    record = read_record(model.config)
    if family.mechanism == "rope":
        current = model.config.get_text_config().max_position_embeddings
        return int(api.describe(model)["original_max_position_embeddings"]), int(current)
    current = family.positions(model)
    return int(record.original.positions if record else current), int(current)


def target_params(params: dict, original: int) -> dict:
    """`params` with a target context: 2x the original when neither max_position_embeddings nor factor is given."""
    params = dict(params)
    if params.get("max_position_embeddings") is None and params.get("factor") is None:
        params["max_position_embeddings"] = 2 * original
    return {k: v for k, v in params.items() if v is not None}


def method_label(method: str | MethodConfig) -> str:
    return method.name if isinstance(method, MethodConfig) else str(method)


@contextlib.contextmanager
def patched(model: torch.nn.Module, method: str | MethodConfig | None, params: dict, what: str) -> Iterator[None]:
    """`model` patched with `method` inside the block and exactly as it was after it (nothing when
    `method` is None). A model that already carries a patch is refused with a message for plots."""
    if method is None:
        yield
        return
    if is_patched(model):
        record = read_record(model.config)
        raise AlreadyPatchedError(
            f"the {what} plot patches the model with {method_label(method)!r} itself, but this model is already "
            f"patched (method {record.method if record else None!r}); pass an unpatched model, or draw this one as it is "
            f"(no method)"
        )
    if isinstance(method, MethodConfig):
        api.patch(model, method)
    else:
        api.patch(model, method, **params)
    try:
        yield
    finally:
        api.unpatch(model)
