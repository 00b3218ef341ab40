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
import dataclasses
import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

import torch
from torch import nn

from .. import _compat, attention, loading
from ..config import (
    AttentionMethodConfig, LearnedMethodConfig, MethodConfig, RopeSwapConfig, SinusoidalConfig, check_number,
)
from ..errors import CheckpointMismatchError, InvalidParameterError, SequenceTooLongError
from ..methods.learned import (
    CALL_STYLES, ORIGINAL_TABLE, LearnedPositions, NoPositions, interpolate_rows, tile_rows, too_long_message,
)
from ..methods.sinusoidal import AffineFit, SinusoidalPositions, fit_affine, rms, sinusoidal_table
from ..plan import RECORD_ATTR, UNDO_ATTR, PatchPlan, Undo
from ..registry import as_model, find_family, get_method, register_family


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

class LearnedTableFamily:
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
        record = getattr(model.config, RECORD_ATTR, None) or {}
        # DistilBERT's own fixed sinusoid, as long as no hf_posenc method has replaced it
        own_sinusoid = self.spec.sinusoidal_flag and getattr(config, self.spec.sinusoidal_flag, False) and not record
        info = {
            "mechanism": "sinusoidal" if own_sinusoid else "learned",
            "position_tables": [t.path for t in tables],
            "position_offset": table_offset(module, self.spec),
            "length_limit": self.length_limit(model),
        }
        fits = list(record.get("tables", {}).values())
        if any("fit_relative_error" in t for t in fits):
            info["fit_relative_error"] = max(t["fit_relative_error"] for t in fits)
        if any("scale" in t for t in fits):
            info["scale"] = fits[0]["scale"]
        return info

    def plan(self, model: nn.Module, method: MethodConfig) -> TablePlan:
        if isinstance(method, AttentionMethodConfig):
            return self._plan_attention(model, method)
        assert isinstance(method, LearnedMethodConfig)
        tables = self.tables(model)
        offset = table_offset(tables[0].module, self.spec)
        positions = self.positions(model)
        method = method.resolve(positions)
        if isinstance(method, SinusoidalConfig) and method.keep_learned >= positions:
            raise InvalidParameterError(
                f"keep_learned={method.keep_learned} keeps every position of this {positions}-position table; "
                f"it must be < {positions}"
            )
        record = self._record(method, model, tables={})
        new_tables = {}
        for table in tables:
            new_tables[table.path], info = self._build(table.module, method, offset, positions)
            record["tables"][table.path] = info
        return self._plan(model, tables, new_tables, record, offset + method.max_position_embeddings)

    def load_patched(self, path, config, record: dict, *, gguf_file: str | None = None, **kwargs) -> nn.Module:
        """Load a checkpoint saved from a patched model and put the patch back (for `hp.from_pretrained`).
        The weights hold the materialised table; the fitted projection of init="fit" is read next to it.
        `hp.unpatch` on the result gives the model stock transformers loads from the same checkpoint."""
        stock_config = copy.deepcopy(config)
        delattr(stock_config, RECORD_ATTR)
        with _compat.quiet_load_report((".projection.weight", ".projection.bias")):  # read below
            model = loading.load_model(path, gguf_file=gguf_file, config=stock_config, **kwargs)
        method_cls = get_method(record["method"])
        names = {f.name for f in dataclasses.fields(method_cls)}
        method = method_cls.from_dict({k: v for k, v in record["params"].items() if k in names})
        tables = self.tables(model)
        offset = table_offset(tables[0].module, self.spec)
        saved = {}
        if isinstance(method, SinusoidalConfig):  # the saved tables (checked below) and the fitted projections
            parts = ("weight", "projection.weight", "projection.bias") if method.init == "fit" else ("weight",)
            wanted = [f"{t.path}.{part}" for t in tables for part in parts]
            saved = _compat.read_checkpoint_tensors(path, wanted)
            missing = sorted(set(wanted) - set(saved))
            if missing:
                raise CheckpointMismatchError(
                    f"{path}: the config records an hf_posenc sinusoidal patch (init={method.init!r}), but the "
                    f"checkpoint lacks {missing}"
                )
        new_tables = {t.path: self._restore(t, method, record, offset, saved) for t in tables}
        plan = self._plan(model, tables, new_tables, copy.deepcopy(record), tables[0].module.num_embeddings)
        plan.apply()
        return model

    def unpatched_config(self, config, record: dict) -> tuple:
        """For a patch that moved positions into attention: the config of the model before it, and the
        tables the checkpoint holds empty (they were removed), for `hp.from_pretrained`."""
        config = copy.deepcopy(config)
        delattr(config, RECORD_ATTR)
        text_config = config.get_text_config()
        text_config.max_position_embeddings = record["original"]["max_position_embeddings"]
        if record["method"] == "rope" and "rope_parameters" in vars(text_config):  # written by the swap
            delattr(text_config, "rope_parameters")
        return config, tuple(f"{path}.weight" for path in record["tables"])

    def restore_original(self, model: nn.Module, path, record: dict) -> str | None:
        """After `hp.from_pretrained` loaded a checkpoint whose tables an attention patch removed (their
        rows random, the saved ones empty): put back each table as it was before the patch, which
        NoPositions saved beside it, so `hp.unpatch` gives the original model. Returns why unpatch must
        be refused instead when the checkpoint lacks them (saved by an older hf_posenc)."""
        tables = self.tables(model)
        wanted = [f"{t.path}.{ORIGINAL_TABLE}" for t in tables]
        saved = _compat.read_checkpoint_tensors(path, wanted)
        if set(saved) != set(wanted):
            return (f"{path} does not hold the position table(s) {[t.path for t in tables]} the {record['method']!r} "
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
            record = getattr(model.config, RECORD_ATTR, None) or {}
            raise SequenceTooLongError(too_long_message(length, limit, record.get("method")))

    # building ------------------------------------------------------------------------------------

    def _record(self, method: MethodConfig, model: nn.Module, tables: dict) -> dict:
        """What config.hf_posenc keeps of a patch: the method, its parameters, the original context, and
        per table what `load_patched` needs (filled in by the caller)."""
        return {
            "family": self.name,
            "mechanism": self.mechanism,
            "method": method.name,
            "params": method.to_dict(),
            "original": {"max_position_embeddings": model.config.get_text_config().max_position_embeddings,
                         "positions": self.positions(model)},
            "tables": tables,
        }

    def _plan_attention(self, model: nn.Module, method: AttentionMethodConfig) -> TablePlan:
        """Positions move into attention: each table becomes a NoPositions, each self-attention module
        gets the method's child; `rope` also writes rope_parameters into the config, so the model is a
        RoPE model from then on (the rotary module is transformers' own, built from that config)."""
        tables = self.tables(model)
        offset = table_offset(tables[0].module, self.spec)
        method = method.resolve(self.positions(model))
        if isinstance(method, RopeSwapConfig):
            _check_rotary_dim(method, _compat.head_dim(model.config.get_text_config()))
        record = self._record(method, model, tables={t.path: {} for t in tables})
        new_tables = {t.path: NoPositions(t.module, offset=offset, call=self.spec.call) for t in tables}
        plan = self._plan(model, tables, new_tables, record, offset + method.max_position_embeddings)
        new_config = plan.config_map[id(model.config.get_text_config())]
        rotary = None
        if isinstance(method, RopeSwapConfig):
            new_config.rope_parameters = {"rope_type": "default", "rope_theta": method.theta,
                                          "partial_rotary_factor": method.partial_rotary_factor}
            rotary = _compat.build_rotary(_compat.GENERIC_ROTARY, new_config, next(model.parameters()).device)
        attention.plan_attention(plan, model, method, new_config, rotary=rotary)
        return plan

    def _build(self, old: nn.Module, method: LearnedMethodConfig, offset: int, positions: int):
        """The new table module for one old table, and what the record keeps about it."""
        weight = old.weight.detach()
        learned = weight[offset: offset + positions]
        if method.name in ("interpolate", "tile"):
            grow = interpolate_rows if method.name == "interpolate" else tile_rows
            new_weight = torch.cat([weight[:offset], grow(learned, method.max_position_embeddings)])
            module = LearnedPositions(new_weight, offset=offset, call=self.spec.call, padding_idx=old.padding_idx,
                                      method=method.name)
            return module, {}
        assert isinstance(method, SinusoidalConfig)
        kept = offset + method.keep_learned
        target = weight[kept: offset + positions]
        features = sinusoidal_table(torch.arange(method.keep_learned, positions), weight.shape[1], method.base)
        scale, fit, info = 1.0, None, {}
        if method.init == "scaled":
            scale = rms(target) / rms(features)
            info = {"scale": scale}
        elif method.init == "fit":
            fit = fit_affine(features, target, method.fit_ridge)
        module = SinusoidalPositions(weight.shape[1], rows=offset + method.max_position_embeddings, offset=offset,
                                     call=self.spec.call, kept_rows=weight[:kept], base=method.base, scale=scale,
                                     fit=fit, trainable=method.trainable)
        if fit is not None:  # measured on the module itself: W and b are stored in the model's dtype
            fitted = module.table(offset + positions)[kept:].double()
            error = (fitted - target.double()).norm() / target.double().norm().clamp_min(1e-30)
            info = {"fit_relative_error": float(error)}
        return module, info

    def _restore(self, table: Table, method: LearnedMethodConfig, record: dict, offset: int, saved: dict):
        """The patched module again, from the table stock transformers loaded (and the saved projection)."""
        stock, path = table.module, table.path
        if method.name in ("interpolate", "tile"):
            module = LearnedPositions(stock.weight.detach(), offset=offset, call=self.spec.call,
                                      padding_idx=stock.padding_idx, method=method.name)
            module.weight = stock.weight  # the loaded parameter itself
            return module
        assert isinstance(method, SinusoidalConfig)
        fit = None
        if method.init == "fit":
            projection_weight, projection_bias = saved[f"{path}.projection.weight"], saved[f"{path}.projection.bias"]
            fit = AffineFit(weight=projection_weight.double().T, bias=projection_bias.double(),
                            relative_error=record["tables"][path].get("fit_relative_error", float("nan")))
        weight = stock.weight.detach()
        module = SinusoidalPositions(weight.shape[1], rows=weight.shape[0], offset=offset, call=self.spec.call,
                                     kept_rows=weight[: offset + method.keep_learned], base=method.base,
                                     scale=record["tables"][path].get("scale", 1.0), fit=fit,
                                     trainable=method.trainable)
        # what this module would save must be what the checkpoint holds, to the precision of the coarser of
        # the dtype it was saved in and the dtype it is loaded in
        saved_table = saved[f"{path}.weight"].double()
        expected = module.table(weight.shape[0]).to(device="cpu", dtype=torch.float64)
        eps = max(torch.finfo(saved[f"{path}.weight"].dtype).eps, torch.finfo(weight.dtype).eps)
        tolerance = 2 * eps * max(1.0, float(expected.abs().max()))
        if expected.shape != saved_table.shape or not torch.allclose(saved_table, expected, rtol=0, atol=tolerance):
            deviation = float((saved_table - expected).abs().max())
            raise CheckpointMismatchError(
                f"the position table {path} in the checkpoint is not the sinusoidal table its config records "
                f"(largest difference {deviation:.3g}): it was changed after hf_posenc saved it (trained as a "
                f"learned table?). Load it with transformers' own from_pretrained to keep that table"
            )
        return module

    def _plan(self, model, tables: list[Table], new_tables: dict, record: dict, rows: int) -> TablePlan:
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
            guard = LengthGuard(buffers, offset, first.limit, record["method"])
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


def _check_rotary_dim(method: RopeSwapConfig, head_dim: int) -> None:
    """Rotary channels come in pairs: the share of each head that rotates must hold at least one pair, and
    whole pairs (transformers' rotary module takes int(head_dim * partial_rotary_factor) channels)."""
    dim = int(head_dim * method.partial_rotary_factor)
    if dim < 2 or dim % 2:
        raise InvalidParameterError(
            f"partial_rotary_factor={method.partial_rotary_factor!r} gives int({head_dim} * "
            f"{method.partial_rotary_factor!r}) = {dim} rotary channels per head of {head_dim}; rotary channels come "
            f"in pairs, so it must give an even number >= 2: the smallest partial_rotary_factor is "
            f"2/{head_dim} = {2 / head_dim:g}"
        )


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
        past = arguments.get("past_key_values_length") or _compat.cache_length(arguments.get("past_key_values"))
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
    family = find_family(model)
    if hasattr(family, "check_length"):
        family.check_length(model, length)


def register_learned_families(*specs: TableSpec) -> None:
    for spec in specs:
        register_family(LearnedTableFamily(spec))


__all__ = ["TableSpec", "GrowingBuffer", "LearnedTableFamily", "check_length", "arange_buffer", "zeros_buffer",
           "register_learned_families"]
