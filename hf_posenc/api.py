"""patch / unpatch / describe / from_pretrained: look up the family and the method, apply, record."""

from __future__ import annotations

import dataclasses
import os

import torch
import transformers

from . import families  # noqa: F401  (registers the family adapters)
from . import _compat, attention, loading
from .config import AttentionMethodConfig, MethodConfig, RopeMethodConfig
from .errors import AlreadyPatchedError, MethodNotApplicableError, NotPatchedError, ParameterTypeError
from .plan import RECORD_ATTR, UNDO_ATTR, is_patched, undo
from .registry import FAMILIES, find_family, get_method, methods_for


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
    cfg = _method_config(method, params)
    record = getattr(model.config, RECORD_ATTR, None) or {}
    # a model swapped to rotary positions (learned -> rope) takes a RoPE scaling method on top
    stacked = record.get("method") == "rope" and UNDO_ATTR in model.__dict__ and isinstance(cfg, RopeMethodConfig)
    if is_patched(model) and not stacked:
        raise AlreadyPatchedError(
            f"this model is already patched (method {record.get('method')!r}); to re-patch, call "
            f"hp.unpatch(model) first, then hp.patch(model, {cfg.name!r}, ...)"
        )
    family = find_family(model)
    if family.mechanism not in cfg.mechanisms:
        raise MethodNotApplicableError(
            f"method {cfg.name!r} applies to {'/'.join(cfg.mechanisms)} positions, but this "
            f"{model.config.model_type} model uses {family.mechanism} positions; methods that apply: "
            f"{', '.join(methods_for(family.mechanism))}"
        )
    plan = family.plan(model, cfg)
    if stacked:
        plan.record["base"] = record
    plan.apply()
    return model


def unpatch(model: torch.nn.Module) -> torch.nn.Module:
    """Undo `patch` exactly: the original modules and config come back."""
    if UNDO_ATTR not in model.__dict__:
        if getattr(getattr(model, "config", None), RECORD_ATTR, None) is not None:
            raise NotPatchedError(
                "this model was loaded from a patched checkpoint by stock transformers, so the original modules "
                "are not in memory; load it with hp.from_pretrained(path) to be able to unpatch it"
            )
        raise NotPatchedError("this model carries no hf_posenc patch")
    undo(model)
    return model


def describe(model: torch.nn.Module) -> dict:
    """The model's positional mechanism and, when patched, the method and its parameters."""
    family = find_family(model)
    config = model.config.get_text_config()
    record = getattr(model.config, RECORD_ATTR, None)
    moved = record and issubclass(get_method(record["method"]), AttentionMethodConfig)
    info = {
        "model_type": config.model_type,
        "family": family.name,
        **(attention.describe(model, record) if moved else family.describe(model)),
        "method": None,
        "max_position_embeddings": config.max_position_embeddings,
    }
    if record:
        params = dict(record["params"])
        info.update(
            method=record["method"],
            factor=params.pop("factor", None),
            original_max_position_embeddings=record["original"]["max_position_embeddings"],
            params={k: v for k, v in params.items() if k != "max_position_embeddings"},
        )
    return info


def from_pretrained(path: str | os.PathLike, *, gguf_file: str | None = None, **kwargs) -> torch.nn.Module:
    """Load a checkpoint and restore any hf_posenc patch recorded in its config, including the ones
    stock transformers cannot express (`dynamic`, `dynamic_yarn`, `alibi`, ...). Keyword arguments go
    to transformers' `from_pretrained` (dtype=, attn_implementation=, ...). A `.gguf` path works too."""
    name, extra = loading.resolve(path, gguf_file)
    config = transformers.AutoConfig.from_pretrained(name, **extra)
    return _load(path, config, gguf_file=gguf_file, **kwargs)


def _load(path, config, *, gguf_file: str | None = None, **kwargs) -> torch.nn.Module:
    record = getattr(config, RECORD_ATTR, None)
    if record is None:
        return loading.load_model(path, gguf_file=gguf_file, config=config, **kwargs)
    family = next(f for f in FAMILIES if f.name == record["family"])
    method = get_method(record["method"])
    if hasattr(family, "load_patched") and not issubclass(method, AttentionMethodConfig):
        return family.load_patched(path, config, record, gguf_file=gguf_file, **kwargs)  # saved tables restored
    # the model before the patch (itself patched when this one was stacked on another), then the patch again
    stock, removed = family.unpatched_config(config, record)
    if "base" in record:
        setattr(stock, RECORD_ATTR, record["base"])
        model = _load(path, stock, gguf_file=gguf_file, **kwargs)
    else:
        extra = {"ignore_mismatched_sizes": True} if removed else {}
        with _compat.quiet_load_report((*removed, *attention.SAVED_SUFFIXES)):
            model = loading.load_model(path, gguf_file=gguf_file, config=stock, **extra, **kwargs)
    field_names = {f.name for f in dataclasses.fields(method)}
    patch(model, method.from_dict({k: v for k, v in record["params"].items() if k in field_names}))
    attention.restore_tensors(model, path)
    return model
