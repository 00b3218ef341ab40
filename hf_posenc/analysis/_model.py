"""What the plots and checks need to know about a model: its mechanism, its original and current context,
its position table, and a temporary patch that is always undone."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from .. import api
from ..config import MethodConfig
from ..errors import AlreadyPatchedError, InvalidParameterError, MethodNotApplicableError, SequenceTooLongError
from ..families.learned_tables import table_offset
from ..methods.learned import too_long_message
from ..methods.sinusoidal import SinusoidalPositions
from ..plan import is_patched
from ..record_reader import read_record
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


def position_table(model: torch.nn.Module, positions: int | None = None) -> torch.Tensor:
    """The vectors the model adds to its input for positions 0..positions-1, as a float64 CPU tensor of
    shape (positions, dim): the learned rows (without the rows some families keep below position 0),
    or the rows of the sinusoidal / interpolated table a patch put in. `positions` defaults to the
    positions the model holds now (its target context when patched)."""
    family = find_family(model)
    if family.mechanism != "learned":
        raise MethodNotApplicableError(
            f"this {model.config.model_type} model uses {family.mechanism} positions: it has no position table "
            f"(the table and similarity plots draw learned or sinusoidal tables; for RoPE use wavelengths or decay)"
        )
    module = family.tables(model)[0].module
    offset = table_offset(module, family.spec)
    n = family.positions(model) if positions is None else int(positions)
    if n < 1:
        raise InvalidParameterError(f"positions must be >= 1, got {positions!r}")
    limit = family.length_limit(model)
    if limit is not None and n > limit:
        record = read_record(model.config)
        raise SequenceTooLongError(too_long_message(n, limit, record.method if record else None))
    if isinstance(module, SinusoidalPositions):
        rows = module.table(offset + n)[offset:]
    else:
        rows = module.weight.detach()[offset: offset + n]
    return rows.to("cpu", torch.float64)


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
    """`hp.patched` for the plots: nothing when `method` is None, and a model that already carries a patch
    is refused with a message that names the plot."""
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
    with api.patched(model, method, **({} if isinstance(method, MethodConfig) else params)):
        yield
