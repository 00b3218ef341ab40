"""A patch as data: the new config tree and the submodules to swap, computed in full before
anything is touched, then applied in one step and undone exactly.

Patching never mutates a config that another model might share: transformers hands the same
config object to every model built from it, so the plan works on a deep copy and re-points this
model's modules at the copy."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from transformers import PreTrainedConfig

from . import _compat
from .errors import NotPatchedError
from .record import RECORD_ATTR, PatchRecord, attach

UNDO_ATTR = "_hf_posenc_undo"


def _first_tensor(module: torch.nn.Module) -> torch.Tensor | None:
    return next(iter([*module.parameters(), *module.buffers()]), None)


def _match_placement(module: torch.nn.Module, like: torch.nn.Module) -> torch.nn.Module:
    """Move `module` to the device (and floating dtype) that `like` lives on now: the model may
    have been moved or cast since the original module was put aside."""
    ref, own = _first_tensor(like), _first_tensor(module)
    if ref is None or own is None:
        return module
    if own.is_floating_point() and ref.is_floating_point() and own.dtype != ref.dtype:
        return module.to(device=ref.device, dtype=ref.dtype)
    return module.to(device=ref.device)


@dataclass
class Undo:
    config: PreTrainedConfig
    swaps: list[tuple[torch.nn.Module, str, torch.nn.Module]]
    config_refs: list[tuple[torch.nn.Module, PreTrainedConfig]]
    previous: Undo | None = None  # the patch this one was stacked on (a RoPE method on a learned -> rope swap)
    refuse: str | None = None  # why this patch cannot be undone (a loaded checkpoint lacks what it replaced)
    note: str | None = None  # what undoing it cannot give back, said as a warning (a loaded table patch)

    def apply(self, model: torch.nn.Module) -> None:
        for parent, name, original in self.swaps:
            if original is None:  # a child the patch added
                delattr(parent, name)
            else:
                setattr(parent, name, _match_placement(original, getattr(parent, name)))
        for module, config in self.config_refs:
            module.config = config


@dataclass
class PatchPlan:
    model: torch.nn.Module
    new_config: PreTrainedConfig
    config_map: dict[int, PreTrainedConfig]  # id(old config or sub-config) -> its copy
    record: PatchRecord
    swaps: list[tuple[torch.nn.Module, str, torch.nn.Module]] = field(default_factory=list)

    def apply(self) -> None:
        model = self.model
        undo = Undo(config=model.config, swaps=[(p, n, getattr(p, n, None)) for p, n, _ in self.swaps],
                    config_refs=[], previous=model.__dict__.get(UNDO_ATTR))
        for parent, name, new in self.swaps:
            setattr(parent, name, new)
        for module in model.modules():
            config = getattr(module, "config", None)
            if isinstance(config, PreTrainedConfig) and id(config) in self.config_map:
                undo.config_refs.append((module, config))
                module.config = self.config_map[id(config)]
        attach(self.new_config, self.record)
        _compat.write_legacy_rope_keys(self.new_config)   # what transformers 4.x reads of the new RoPE
        model.__dict__[UNDO_ATTR] = undo


def is_patched(model: torch.nn.Module) -> bool:
    return UNDO_ATTR in model.__dict__ or getattr(getattr(model, "config", None), RECORD_ATTR, None) is not None


def undo(model: torch.nn.Module) -> str | None:
    """Undo the last patch (a stacked patch leaves the one below it in place); returns its `note_unpatch`."""
    last = model.__dict__[UNDO_ATTR]
    if last.refuse:
        raise NotPatchedError(last.refuse)
    del model.__dict__[UNDO_ATTR]
    last.apply(model)
    if last.previous is not None:
        model.__dict__[UNDO_ATTR] = last.previous
    return last.note


def refuse_unpatch(model: torch.nn.Module, why: str | None) -> None:
    """Make undoing the model's last patch raise NotPatchedError(why) (None: allowed): a loaded checkpoint
    lacks what the patch replaced."""
    model.__dict__[UNDO_ATTR].refuse = why


def note_unpatch(model: torch.nn.Module, note: str) -> None:
    """Warn with `note` when the model's last patch is undone: what undoing it cannot give back."""
    model.__dict__[UNDO_ATTR].note = note
