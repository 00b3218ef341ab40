"""The generic adapter for models whose positions are a learned table added to the input. A family
is a `TableSpec`: where its tables live, how its model calls them, the rows below position 0, and the
buffers sized by the context that must grow with it. The family files (gpt2.py, bert.py, ...) hold
the specs.

A patch swaps each table for a `SinusoidalPositions` (unbounded) or a `LearnedPositions` (a longer
learned table that refuses longer inputs with a clear error), writes the new context into a copy of
the config, and records the patch in it. Saving writes the table each new module equals up to the
new context, under the table's own name, so stock transformers loads the checkpoint as a plain
learned model with the same logits; `load_patched` (used by `hp.from_pretrained`) puts the modules
back, reading the fitted projection of init="fit" from the checkpoint.
"""

from __future__ import annotations

import copy
import inspect
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

import torch
from torch import nn

from .. import _compat, attention
from ..attention import AttentionMethodConfig
from ..config import LearnedMethodConfig, MethodConfig, check_number
from ..errors import CheckpointMismatchError, CheckpointRecordError, PosEncError, SequenceTooLongError
from ..family import Family, as_model, find_family, register_family
from ..methods.learned import CALL_STYLES, ORIGINAL_TABLE, NoPositions, too_long_message
from ..methods.sinusoidal import SinusoidalPositions
from ..plan import UNDO_ATTR, PatchPlan, Undo, note_unpatch
from ..record import Original, PatchRecord, TableRecord, detach
from ..record_reader import method_class, method_config, read_record


# -- buffers sized by the context ------------------------------------------------------------------

def arange_buffer(owner: nn.Module, length: int, old: torch.Tensor) -> torch.Tensor:
    """BERT's `position_ids`: 0..length-1, shaped like the old buffer."""
    return torch.arange(length, dtype=old.dtype, device=old.device).expand(*old.shape[:-1], length).clone()


def zeros_buffer(owner: nn.Module, length: int, old: torch.Tensor) -> torch.Tensor:
    """BERT's `token_type_ids`: zeros, shaped like the old buffer."""
    return old.new_zeros(*old.shape[:-1], length)


@dataclass(frozen=True)
class GrowingBuffer:
    """A buffer whose last dimension is the context: it grows with the table."""

    path: str  # the owning module, relative to the base model; "*" matches any one name (h.*.attn)
    name: str
    build: Callable[[nn.Module, int, torch.Tensor], torch.Tensor]  # (owner, length, old buffer) -> new buffer


@dataclass(frozen=True)
class TableSpec:
    name: str
    model_types: tuple[str, ...]  # the model_types tests/test_learned.py covers
    tables: tuple[str, ...]  # the position tables, relative to model.base_model (missing ones are skipped)
    call: str = "ids"  # how the model calls a table: see hf_posenc.methods.learned.CALL_STYLES
    # RoBERTa: position 0 is row padding_idx + 1, and max_position_embeddings counts the rows below it.
    # (OPT and BART tables carry their own `offset` attribute, and their config counts positions.)
    padding_offset: bool = False
    buffers: tuple[GrowingBuffer, ...] = ()
    guard_at: str = ""  # the module whose call sizes the buffers (relative to the base model)
    sinusoidal_flag: str | None = None  # DistilBERT: the config flag of its own fixed sinusoidal table

    def __post_init__(self) -> None:
        if self.call not in CALL_STYLES:
            raise ValueError(f"TableSpec {self.name!r}: call must be one of {CALL_STYLES}, got {self.call!r}")


class Table(NamedTuple):
    path: str  # relative to the base model
    parent: nn.Module
    attr: str
    module: nn.Module


# -- the family ------------------------------------------------------------------------------------

class LearnedTableFamily(Family):
    mechanism = "learned"

    def __init__(self, spec: TableSpec):
        self.spec = spec
        self.name = spec.name
        self.model_types = spec.model_types

    # protocol ------------------------------------------------------------------------------------

    def matches(self, model: nn.Module) -> bool:
        config = getattr(model, "config", None)
        return getattr(config, "model_type", None) in self.model_types and bool(self.tables(model))

    def describe(self, model: nn.Module) -> dict:
        tables = self.tables(model)
        module, config = tables[0].module, model.config.get_text_config()
        record = read_record(model.config)
        # DistilBERT's own fixed sinusoid, as long as no hf_posenc method has replaced it
        own_sinusoid = (self.spec.sinusoidal_flag and getattr(config, self.spec.sinusoidal_flag, False)
                        and record is None)
        info = {
            "mechanism": "sinusoidal" if own_sinusoid else "learned",
            "position_tables": [t.path for t in tables],
            "position_offset": table_offset(module, self.spec),
            "length_limit": self.length_limit(model),
        }
        fits = list((record.tables or {}).values()) if record is not None else []
        if any(t.fit_relative_error is not None for t in fits):
            info["fit_relative_error"] = max(t.fit_relative_error for t in fits if t.fit_relative_error is not None)
        if any(t.scale is not None for t in fits):
            info["scale"] = next(t.scale for t in fits if t.scale is not None)
        return info

    def plan(self, model: nn.Module, method: MethodConfig) -> TablePlan:
        if isinstance(method, AttentionMethodConfig):
            return self._plan_attention(model, method)
        assert isinstance(method, LearnedMethodConfig)
        tables = self.tables(model)
        offset = table_offset(tables[0].module, self.spec)
        positions = self.positions(model)
        method = method.resolve(positions)
        new_tables, infos = {}, {}
        for table in tables:
            new_tables[table.path], infos[table.path] = method.build_table(
                table.module, offset=offset, positions=positions, call=self.spec.call)
        record = self._record(method, model, tables={path: TableRecord(**info) for path, info in infos.items()})
        return self._plan(model, tables, new_tables, record, offset + method.max_position_embeddings)

    @staticmethod
    def _holds_table(record: PatchRecord) -> bool:
        # a table method's checkpoint holds the table it made; an attention method's is replayed
        return issubclass(method_class(record), LearnedMethodConfig)

    def rebuild_saved_patch(self, model: nn.Module, path, record: PatchRecord) -> bool:
        """A table method: put the patch back on the model stock transformers loaded from a checkpoint saved from
        a patched one (for `hp.from_pretrained`), True; an attention method: False (replayed). The weights hold
        the materialised table; the fitted projection of init="fit" is read next to it. The table the patch
        replaced is not in the checkpoint: `hp.unpatch` on the result gives the model stock transformers loads
        from the same checkpoint (the saved table, as a plain learned table), and warns so."""
        if not self._holds_table(record):
            return False
        method = method_config(record)
        tables = self.tables(model)
        if set(record.tables) != {t.path for t in tables}:
            raise CheckpointRecordError(
                f"{path}: its config's hf_posenc record names the position table(s) {sorted(record.tables)}, but "
                f"this {self.name} model has {[t.path for t in tables]}; the record was edited after saving. Save "
                f"the model again from the patched one"
            )
        offset = table_offset(tables[0].module, self.spec)
        self._check_record_rows(path, record, method, tables, offset)
        wanted = [f"{t.path}.{part}" for t in tables for part in method.checkpoint_parts()]
        saved = _compat.read_checkpoint_tensors(path, wanted) if wanted else {}
        missing = sorted(set(wanted) - set(saved))
        if missing:
            raise CheckpointMismatchError(
                f"{path}: the config records an hf_posenc {method.name!r} patch ({record.params}), but the "
                f"checkpoint lacks {missing}"
            )
        new_tables = {}
        for t in tables:
            parts = {part: saved[f"{t.path}.{part}"] for part in method.checkpoint_parts()}
            try:
                new_tables[t.path] = method.restore_table(t.module, offset=offset, call=self.spec.call,
                                                          info=record.tables[t.path].to_dict(), saved=parts)
            except CheckpointMismatchError as err:
                raise CheckpointMismatchError(f"{path}: {t.path}: {err}") from None
        plan = self._plan(model, tables, new_tables, record, tables[0].module.num_embeddings)
        plan.apply()
        # the folder holds the table the patch made (what stock transformers loads), not the one it replaced
        note_unpatch(model, (
            f"hp.unpatch: {path} holds only the position table(s) the {method.name!r} patch made "
            f"({', '.join(t.path for t in tables)}: {tables[0].module.num_embeddings} rows), not the original "
            f"one(s), so the unpatched model is that table as a plain learned table, the model stock transformers "
            f"loads from the folder; not the model before the patch (load the original checkpoint for that)"))
        return True

    @staticmethod
    def _check_record_rows(path, record: PatchRecord, method: MethodConfig, tables: list[Table], offset: int) -> None:
        """The record's parameters must describe the tables saved beside it: `factor: 4.0` over a table
        interpolated to twice the original context would load the saved table and report factor 4."""
        config_file = os.path.join(path, "config.json") if os.path.isdir(path) else f"{path} (config.json)"
        where = f"{config_file}: its hf_posenc record ({record.method!r}, parameters {record.params}, original " \
                f"{record.original.positions} positions)"
        try:
            resolved = method.resolve(record.original.positions)
        except PosEncError as err:
            raise CheckpointRecordError(f"{where} is not a patch hf_posenc makes ({err}); the record was edited "
                                        f"after saving. Save the model again from the patched one") from None
        for t in tables:
            positions = table_rows_count(t.module) - offset
            if positions != resolved.max_position_embeddings:
                raise CheckpointRecordError(
                    f"{where} gives a table of {resolved.max_position_embeddings} positions (factor "
                    f"{resolved.factor:g}), but the saved table {t.path}.weight holds {positions} positions "
                    f"({table_rows_count(t.module)} rows); the record was edited after saving. Save the model again "
                    f"from the patched one, or delete the hf_posenc field to load the saved table as stock "
                    f"transformers reads it"
                )

    def unpatched_config(self, config, record: PatchRecord) -> tuple:
        """For a patch that moved positions into attention: the config of the model before it, and the
        tables the checkpoint holds empty (they were removed), for `hp.from_pretrained`. For a table method:
        the saved config without the record (stock transformers loads the table the patch made)."""
        config = copy.deepcopy(config)
        detach(config)
        if self._holds_table(record):
            return config, ()
        text_config = config.get_text_config()
        text_config.max_position_embeddings = record.original.max_position_embeddings
        if method_class(record).writes_rope_parameters and "rope_parameters" in vars(text_config):
            delattr(text_config, "rope_parameters")
        return config, tuple(f"{path}.weight" for path in record.tables)

    def read_back(self, record: PatchRecord) -> tuple[str, ...]:
        if self._holds_table(record):  # the parts beside the table (init="fit"'s projection)
            return tuple(f".{part}" for part in method_config(record).checkpoint_parts() if part != "weight")
        return (f".{ORIGINAL_TABLE}",)  # the table an attention method removed, saved beside it

    def restore_original(self, model: nn.Module, path, record: PatchRecord) -> str | None:
        """After `hp.from_pretrained` loaded a checkpoint whose tables an attention patch removed (their
        rows random, the saved ones empty): put back each table as it was before the patch, which
        NoPositions saved beside it, so `hp.unpatch` gives the original model. Returns why unpatch must
        be refused instead when the checkpoint lacks them (saved by an older hf_posenc)."""
        tables = self.tables(model)
        wanted = [f"{t.path}.{ORIGINAL_TABLE}" for t in tables]
        saved = _compat.read_checkpoint_tensors(path, wanted)
        if set(saved) != set(wanted):
            return (f"{path} does not hold the position table(s) {[t.path for t in tables]} the {record.method!r} "
                    f"patch removed (it was saved by an older hf_posenc), so unpatching this model would leave a "
                    f"random table. It stays patched; for the model without the patch, load the original checkpoint "
                    f"(and save patched models again to keep their table)")
        with torch.no_grad():
            for table in tables:
                value = saved[f"{table.path}.{ORIGINAL_TABLE}"]
                if value.shape != table.module.weight.shape:
                    raise CheckpointMismatchError(
                        f"{path}: the saved original table {table.path}.{ORIGINAL_TABLE} has shape "
                        f"{tuple(value.shape)}, but the model's config gives {tuple(table.module.weight.shape)}"
                    )
                table.module.weight.copy_(value)
        return None

    # queries -------------------------------------------------------------------------------------

    def tables(self, model: nn.Module) -> list[Table]:
        base = getattr(model, "base_model", model)
        found = []
        for path in self.spec.tables:
            parent_path, _, attr = path.rpartition(".")
            try:
                parent = base.get_submodule(parent_path)
            except AttributeError:
                continue
            module = getattr(parent, attr, None)
            if isinstance(module, (nn.Embedding, SinusoidalPositions, NoPositions)):
                found.append(Table(path, parent, attr, module))
        return found

    def positions(self, model: nn.Module) -> int:
        """How many positions the (first) table holds now."""
        module = self.tables(model)[0].module
        return table_rows_count(module) - table_offset(module, self.spec)

    def length_limit(self, model: nn.Module) -> int | None:
        """The longest input the model takes now; None when there is no limit."""
        module = self.tables(model)[0].module
        return None if isinstance(module, (SinusoidalPositions, NoPositions)) else self.positions(model)

    def check_length(self, model: nn.Module, length: int) -> None:
        limit = self.length_limit(model)
        if limit is not None and length > limit:
            record = read_record(model.config)
            raise SequenceTooLongError(too_long_message(length, limit, record.method if record else None))

    # building ------------------------------------------------------------------------------------

    def _record(self, method: MethodConfig, model: nn.Module, tables: dict[str, TableRecord]) -> PatchRecord:
        """What config.hf_posenc keeps of a patch: the method, its parameters, the original context, and
        per table what `load_patched` needs."""
        return PatchRecord(
            family=self.name, mechanism=self.mechanism, method=method.name, params=method.to_dict(),
            original=Original(max_position_embeddings=model.config.get_text_config().max_position_embeddings,
                              positions=self.positions(model)),
            tables=tables,
        )

    def _plan_attention(self, model: nn.Module, method: AttentionMethodConfig) -> TablePlan:
        """Positions move into attention: each table becomes a NoPositions, each self-attention module
        gets the method's child; a method that rotates (`rope`) also writes rope_parameters into the config,
        so the model is a RoPE model from then on (the rotary module is transformers' own, built from it)."""
        tables = self.tables(model)
        offset = table_offset(tables[0].module, self.spec)
        method = method.resolve(self.positions(model))
        record = self._record(method, model, tables={t.path: TableRecord() for t in tables})
        new_tables = {t.path: NoPositions(t.module, offset=offset, call=self.spec.call) for t in tables}
        plan = self._plan(model, tables, new_tables, record, offset + method.max_position_embeddings)
        new_config = plan.config_map[id(model.config.get_text_config())]
        rotary = method.learned_rotary(new_config, next(model.parameters()).device)
        attention.plan_attention(plan, model, method, new_config, rotary=rotary)
        return plan

    def _plan(self, model, tables: list[Table], new_tables: dict, record: PatchRecord, rows: int) -> TablePlan:
        new_root, config_map = _compat.copy_config_tree(model.config)
        new_config = config_map[id(model.config.get_text_config())]
        offset = table_offset(tables[0].module, self.spec)
        new_config.max_position_embeddings = rows if self.spec.padding_offset else rows - offset
        plan = TablePlan(model=model, new_config=new_root, config_map=config_map, record=record)
        for table in tables:
            plan.swaps.append((table.parent, table.attr, new_tables[table.path]))
        first = new_tables[tables[0].path]
        buffers = self._buffers(model)
        for owner, name, build in buffers:  # every one goes in the plan: the guard may grow it, undo shrinks it
            current = getattr(owner, name)
            plan.buffers.append((owner, name, current if current.shape[-1] == rows else build(owner, rows, current)))
        if buffers:
            base = getattr(model, "base_model", model)
            guard = LengthGuard(buffers, offset, first.limit, record.method)
            plan.guards.append((base.get_submodule(self.spec.guard_at), guard))
        return plan

    def _buffers(self, model) -> list[tuple[nn.Module, str, Callable]]:
        base = getattr(model, "base_model", model)
        found = []
        for buffer in self.spec.buffers:
            pattern = buffer.path.split(".") if buffer.path else []
            for name, module in base.named_modules():
                parts = name.split(".") if name else []
                if len(parts) == len(pattern) and all(p in ("*", q) for p, q in zip(pattern, parts)) \
                        and buffer.name in module._buffers:
                    found.append((module, buffer.name, buffer.build))
        return found


def table_offset(module: nn.Module, spec: TableSpec) -> int:
    """The row of position 0."""
    if hasattr(module, "offset"):  # OPT, BART and our own modules say it
        return int(module.offset)
    return module.padding_idx + 1 if spec.padding_offset else 0


def table_rows_count(module: nn.Module) -> int:
    return module.rows if isinstance(module, SinusoidalPositions) else module.num_embeddings


# -- the plan: module swaps, plus buffers and a length guard ---------------------------------------

@dataclass
class TableUndo(Undo):
    buffers: list[tuple[nn.Module, str, torch.Tensor]] = field(default_factory=list)
    handles: list = field(default_factory=list)

    def apply(self, model: nn.Module) -> None:
        for handle in self.handles:
            handle.remove()
        for owner, name, original in self.buffers:
            setattr(owner, name, original.to(getattr(owner, name).device))
        super().apply(model)


@dataclass
class TablePlan(PatchPlan):
    """A PatchPlan that also resizes the buffers sized by the context and installs the length guard."""

    buffers: list[tuple[nn.Module, str, torch.Tensor]] = field(default_factory=list)
    guards: list[tuple[nn.Module, Callable]] = field(default_factory=list)

    def apply(self) -> None:
        originals = [(owner, name, getattr(owner, name)) for owner, name, _ in self.buffers]
        super().apply()
        for owner, name, value in self.buffers:
            setattr(owner, name, value)
        handles = [module.register_forward_pre_hook(guard, with_kwargs=True) for module, guard in self.guards]
        undo = self.model.__dict__[UNDO_ATTR]
        self.model.__dict__[UNDO_ATTR] = TableUndo(undo.config, undo.swaps, undo.config_refs, undo.previous,
                                                   buffers=originals, handles=handles)


class LengthGuard:
    """Forward pre-hook on the module that slices the context-sized buffers (BERT's embeddings, GPT-Neo's
    model). Before each call: refuse an input longer than a bounded table, else grow the buffers to fit
    it (they would otherwise run out before the table is even reached)."""

    def __init__(self, buffers: list[tuple[nn.Module, str, Callable]], offset: int, limit: int | None, method: str):
        self.buffers, self.offset, self.limit, self.method = buffers, offset, limit, method
        self._signature: inspect.Signature | None = None

    def __call__(self, module: nn.Module, args: tuple, kwargs: dict):
        if self._signature is None:
            self._signature = inspect.signature(module.forward)
        length = self.input_length(self._signature.bind_partial(*args, **kwargs).arguments)
        if self.limit is not None and length > self.limit:
            raise SequenceTooLongError(too_long_message(length, self.limit, self.method))
        rows = self.offset + length
        for owner, name, build in self.buffers:
            current = getattr(owner, name)
            if current.shape[-1] < rows:
                setattr(owner, name, build(owner, max(rows, 2 * current.shape[-1]), current))
        return None

    def input_length(self, arguments: dict) -> int:
        """Positions the call needs: cached + new tokens, or the largest position id given + 1."""
        tokens = arguments.get("input_ids")
        if tokens is None:
            tokens = arguments.get("inputs_embeds")
        length = tokens.shape[1] if tokens is not None else 0
        # transformers >= 5.24 names the cache `cache` in some families (GPT-Neo), `past_key_values` in others
        cache = arguments.get("cache", arguments.get("past_key_values"))
        past = arguments.get("past_key_values_length") or _compat.cache_length(cache)
        length += past
        position_ids = arguments.get("position_ids")
        if position_ids is not None and position_ids.numel():
            length = max(length, int(position_ids.max()) + 1 - self.offset)
        return length


# -- public helpers --------------------------------------------------------------------------------

def check_length(model: nn.Module, length: int) -> None:
    """Raise SequenceTooLongError, naming the length, the limit and the methods that lift it, when
    `model` cannot take an input of `length` tokens (a learned table, patched or not). Models with no
    limit pass."""
    model = as_model(model, "check_length")
    check_number("length", length, minimum=0, integer=True, optional=False)
    find_family(model).check_length(model, length)


def register_learned_families(*specs: TableSpec) -> None:
    for spec in specs:
        register_family(LearnedTableFamily(spec))


__all__ = ["TableSpec", "GrowingBuffer", "LearnedTableFamily", "check_length", "arange_buffer", "zeros_buffer",
           "register_learned_families"]
