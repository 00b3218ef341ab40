"""patch / unpatch / patched / describe / from_pretrained: look up the family and the method, apply, record."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import json
import os
import warnings
from collections.abc import Iterator

import torch
import transformers

from . import _compat, attention, loading
from .attention import AttentionMethodConfig
from .config import MethodConfig
from .errors import AlreadyPatchedError, CheckpointMismatchError, CheckpointRecordError, NotPatchedError, ParameterTypeError
from .plan import UNDO_ATTR, is_patched, refuse_unpatch, undo
from .record import PatchRecord, attach, detach
from .record_reader import family_of, method_class, method_config, read_record
from .registry import as_model, find_family, get_method, plan_patch


def _method_config(method: str | MethodConfig, params: dict) -> MethodConfig:
    if isinstance(method, MethodConfig):
        if params:
            raise ParameterTypeError(
                f"give the parameters either in the {type(method).__name__} or as keywords, not both "
                f"(got keywords {sorted(params)})"
            )
        return method
    return get_method(method).from_dict(params)


def patch(model: torch.nn.Module, method: str | MethodConfig, **params) -> torch.nn.Module:
    """Swap or rescale `model`'s positional mechanism in place; returns the same model.

    `method` is a name from `list_methods()` or a method config (`hp.configs.YarnConfig(...)`).
    The target context is `max_position_embeddings=`; `factor=` over the original context is
    derived from it, or the reverse. Everything is checked before the model is touched: a refused
    call leaves the model as it was."""
    given, model = model, as_model(model, "patch")
    cfg = _method_config(method, params)
    record = read_record(model.config)
    # a patch in memory that the method may go on top of (a RoPE method on a learned -> rope swap)
    stacked = record is not None and UNDO_ATTR in model.__dict__ and cfg.stacks_on(method_class(record))
    if is_patched(model) and not stacked:
        raise AlreadyPatchedError(
            f"this model is already patched (method {getattr(record, 'method', None)!r}); to re-patch, call "
            f"hp.unpatch(model) first, then hp.patch(model, {cfg.name!r}, ...)"
        )
    plan = plan_patch(model, cfg)
    if stacked:
        plan.record = dataclasses.replace(plan.record, base=record)
    try:  # what save_pretrained will write: refused now rather than as a half-written config.json
        json.dumps(plan.record.to_dict())
    except (TypeError, ValueError) as err:
        raise ParameterTypeError(f"the parameters of {cfg.name!r} cannot be saved in config.json ({err}): {cfg}") from None
    added = {id(p) for _, _, new in plan.swaps if new is not None for p in new.parameters() if p.requires_grad}
    training = model.training or any(p.grad is not None for p in model.parameters())
    plan.apply()
    if added and training:
        names = [name for name, p in model.named_parameters() if id(p) in added]
        warnings.warn(
            f"hp.patch(model, {cfg.name!r}) replaced positional modules of a model in training mode: the new trainable "
            f"parameters {names[:4]}{' ...' if len(names) > 4 else ''} are not in any optimizer built before this "
            f"call, which would not train them. Build the optimizer after hp.patch, or add them to it "
            f"(optimizer.add_param_group)", stacklevel=2,
        )
    return given


def unpatch(model: torch.nn.Module) -> torch.nn.Module:
    """Undo `patch` exactly: the original modules and config come back. On a model `from_pretrained` loaded:
    the same for RoPE and attention patches (their record and checkpoint hold what they replaced); a learned-
    table patch (sinusoidal, interpolate, tile, hierarchical) saved only the table it made, so its unpatched
    model is that table as a plain learned table (what stock transformers loads from the folder), with a warning
    saying so; an attention patch saved by an older hf_posenc without the table it removed is refused."""
    given, model = model, as_model(model, "unpatch")
    if UNDO_ATTR not in model.__dict__:
        if read_record(model.config) is not None:
            raise NotPatchedError(
                "this model was loaded from a patched checkpoint by stock transformers, so the original modules "
                "are not in memory; load it with hp.from_pretrained(path) to be able to unpatch it"
            )
        raise NotPatchedError("this model carries no hf_posenc patch")
    note = undo(model)  # what a loaded checkpoint cannot give back
    if note:
        warnings.warn(note, stacklevel=2)
    return given


@contextlib.contextmanager
def patched(model: torch.nn.Module, method: str | MethodConfig, **params) -> Iterator[torch.nn.Module]:
    """`hp.patch(model, method, **params)` for the duration of a `with` block, then `hp.unpatch`, also when
    the block raises; yields the model. The patch is checked and refused as `hp.patch` refuses it (an
    already patched model raises AlreadyPatchedError before the block runs; a RoPE method on a learned ->
    rope swap stacks, and only that method is peeled off after). Patches the block itself adds on top
    are peeled off too: after the block the model is as it was before it."""
    inner = as_model(model, "patched")
    before = inner.__dict__.get(UNDO_ATTR)  # the patch below ours (a learned -> rope swap), or None
    patch(model, method, **params)
    try:
        yield model
    finally:
        while UNDO_ATTR in inner.__dict__ and inner.__dict__[UNDO_ATTR] is not before:
            unpatch(model)


def describe(model: torch.nn.Module) -> dict:
    """The model's positional mechanism and, when patched, the method and its parameters."""
    model = as_model(model, "describe")
    family = find_family(model)
    config = model.config.get_text_config()
    record = read_record(model.config)
    moved = record is not None and issubclass(method_class(record), AttentionMethodConfig)
    info = {
        "model_type": config.model_type,
        "family": family.name,
        **(attention.describe(model, method_config(record), record.original.max_position_embeddings) if moved
           else family.describe(model)),
        "method": None,
        "max_position_embeddings": config.max_position_embeddings,
    }
    if record is not None:
        params = dict(record.params)
        info.update(
            method=record.method,
            factor=params.pop("factor", None),
            original_max_position_embeddings=record.original.max_position_embeddings,
            params={k: v for k, v in params.items() if k != "max_position_embeddings"},
        )
    return info


def from_pretrained(path: str | os.PathLike, *, gguf_file: str | None = None, **kwargs) -> torch.nn.Module:
    """Load a checkpoint and restore any hf_posenc patch recorded in its config, including the ones
    stock transformers cannot express (`dynamic`, `dynamic_yarn`, `alibi`, ...). Keyword arguments go
    to transformers' `from_pretrained` (dtype=, attn_implementation=, ...). A `.gguf` path works too."""
    name, extra = loading.resolve(path, gguf_file)
    config = transformers.AutoConfig.from_pretrained(name, **extra)
    source = os.path.join(name, "config.json") if os.path.isdir(name) else f"{name} (config.json)"
    with _readable_weights(name, config, source, gguf_file):
        model = _load(path, config, gguf_file=gguf_file, source=source, **kwargs)
    record = read_record(config, source)
    if record is not None:
        _check_replay(model, config, record, source)
    return model


def load_model(ref: str | os.PathLike, *, gguf_file: str | None = None, **kwargs) -> torch.nn.Module:
    """`hp.load_model`: the model as transformers loads it (hf_posenc.loading.load_model: GGUF files, the embedded
    aliases, the cache), except a folder hf_posenc saved with a patch stock transformers cannot build (an attention
    method, a length-following rope: its rope_type is hf_posenc's own), which loads as `from_pretrained` loads it."""
    name, extra = loading.resolve(ref, gguf_file)
    if not extra and os.path.isdir(name) and "config" not in kwargs:
        config = transformers.AutoConfig.from_pretrained(name)
        if read_record(config) is not None and _compat.has_custom_rope_type(config):
            return from_pretrained(ref, **kwargs)
    return loading.load_model(ref, gguf_file=gguf_file, **kwargs)


def _check_replay(model: torch.nn.Module, config, record: PatchRecord, source: str) -> None:
    """The record, replayed on the checkpoint, must give the config it sits in: a record edited apart from
    its config (`linear` in the record, `yarn` in rope_parameters) would load as one model here and as
    another in stock transformers."""
    def plain(value):
        return json.loads(json.dumps(value, default=str))

    saved, replayed = config.get_text_config(), model.config.get_text_config()
    for name in ("rope_parameters", "max_position_embeddings"):
        written, expected = plain(getattr(saved, name, None)), plain(getattr(replayed, name, None))
        if written != expected:
            raise CheckpointRecordError(
                f"{source}: its hf_posenc record (method {record.method!r}) and its {name} disagree: "
                f"the config says {written}, the record gives {expected}. Stock transformers would load one model "
                f"and hf_posenc another; the file was edited after saving. Save it again from the patched model, or "
                f"delete the hf_posenc field to load it as stock transformers reads it"
            )


def _load(path, config, *, gguf_file: str | None = None, source: str | None = None, **kwargs) -> torch.nn.Module:
    record = read_record(config, source)
    if record is None:
        return loading.load_model(path, gguf_file=gguf_file, config=config, **kwargs)
    family = family_of(record)
    # the model before the patch (itself patched when this one was stacked on another), then the patch again; or,
    # where the checkpoint holds the patched modules as stock transformers loads them, that model, patch rebuilt
    stock, removed = family.unpatched_config(config, record)
    why_not_unpatch = None
    if record.base is not None:
        attach(stock, record.base)
        model = _load(path, stock, gguf_file=gguf_file, source=source, **kwargs)
    else:
        extra = {"ignore_mismatched_sizes": True} if removed else {}
        ours = (*removed, *attention.SAVED_SUFFIXES, *family.read_back(record))   # what the patch puts back itself
        with _compat.quiet_load_report(ours):
            model = loading.load_model(path, gguf_file=gguf_file, config=stock, expected_missing=ours, **extra,
                                       **kwargs)
        if family.rebuild_saved_patch(model, path, record):
            return model
        if removed:  # the tables the patch removed, as they were before it
            why_not_unpatch = family.restore_original(model, path, record)
    patch(model, method_config(record))
    try:
        attention.restore_tensors(model, path)
    except RuntimeError:  # load_state_dict: a saved table of another shape than the record gives
        raise CheckpointMismatchError(_attention_disagreement(model, path, record, source)) from None
    refuse_unpatch(model, why_not_unpatch)
    return model


# -- a damaged or edited checkpoint: one clear error naming the file and what disagrees -------------------

def _shape_disagreement(name: str, config, limit: int = 4) -> str:
    """Which saved tensors have another shape than the model `config` describes (the skeleton built on the
    meta device: no memory), as "key: saved (r, c), the config gives (r, c)"; "" when it cannot tell."""
    from safetensors import safe_open

    try:
        stock = copy.deepcopy(config)
        detach(stock)
        with torch.device("meta"):
            cls = loading._auto_class(name, {}, None, stock)
            skeleton = cls.from_config(stock) if hasattr(cls, "from_config") else cls._from_config(stock)
        expected = {key: tuple(t.shape) for key, t in skeleton.state_dict().items()}
        found = []
        for file in _compat._safetensors_files(name):
            with safe_open(file, framework="pt") as f:
                for key in f.keys():
                    match = expected.get(key) or next(
                        (shape for k, shape in expected.items() if k.endswith("." + key) or key.endswith("." + k)),
                        None)
                    saved = tuple(f.get_slice(key).get_shape())
                    if match is not None and match != saved:
                        found.append(f"{key}: saved {saved}, the config gives {match}")
    except Exception:  # noqa: BLE001  (a detail for the message; the error is raised either way)
        return ""
    return "; ".join(found[:limit]) + (" ..." if len(found) > limit else "")


@contextlib.contextmanager
def _readable_weights(name: str, config, source: str, gguf_file: str | None):
    """Turn what a damaged or edited checkpoint makes the loaders raise (safetensors' "incomplete metadata"
    naming no file, transformers' size mismatch pointing at a report the log level may hide) into a
    CheckpointMismatchError naming the file and what is wrong with it."""
    from safetensors import SafetensorError

    try:
        yield
    except SafetensorError as err:
        damaged = loading.damaged_safetensors(name) or [f"{loading.weights_file(name)} ({err})"]
        raise CheckpointMismatchError(
            f"{'; '.join(damaged)}: not a complete safetensors file: truncated or overwritten since it was saved "
            f"(a copy or download cut short, a full disk). Save or download the checkpoint again"
        ) from None
    except RuntimeError as err:
        if gguf_file is not None or not ("size mismatch" in str(err) or "ignore_mismatched_sizes" in str(err)):
            raise
        detail = _shape_disagreement(name, config) or str(err).splitlines()[0]
        raise CheckpointMismatchError(
            f"{loading.weights_file(name)}: its tensors do not have the shapes {source} gives ({detail}); the config "
            f"or the weights were edited after saving (or come from different models). Save the model again, or load "
            f"the config and weights that belong together"
        ) from None


def _attention_disagreement(model: torch.nn.Module, path, record: PatchRecord, source: str) -> str:
    """Why the tensors an attention patch trained do not fit the model its record builds: key, shapes."""
    wanted = attention.trained_tensors(model)
    saved = _compat.read_checkpoint_tensors(path, wanted)
    expected = model.state_dict()
    found = [f"{key}: saved {tuple(saved[key].shape)}, the record gives {tuple(expected[key].shape)}"
             for key in wanted if key in saved and saved[key].shape != expected[key].shape]
    listed = "; ".join(found[:3]) + (" ..." if len(found) > 3 else "")
    name, _ = loading.resolve(path)
    return (f"{loading.weights_file(name)}: the hf_posenc record in {source} (method {record.method!r}, parameters "
            f"{record.params}) does not fit the tensors saved beside it ({listed}); the record or the weights were "
            f"edited after saving. Save the model again from the patched one")
