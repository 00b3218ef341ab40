"""The checkpoint contract: what a model's config keeps of an hf_posenc patch, in one place.

A patch writes a `PatchRecord` into the patched config as the plain dict `config.hf_posenc` (plain, since
transformers writes config attributes to config.json as they are); `hp.from_pretrained` reads it back to put
the patch on the loaded checkpoint again. This module holds the record as plain data and is the only one that
writes that dict (`attach`) or removes it (`detach`); record_reader.py is the only one that reads it (checked
against the registered families and methods, so it sits above both). Plain data, importing nothing of the
package: every layer may name a record.

Format 1 (the `format_version` key, written from format 1 on; a record without it, as hf_posenc wrote
before, is format 1 too):

    {"format_version": 1, "family": "rope", "mechanism": "rope", "method": "yarn",
     "params": {...},                     # the method config's to_dict()
     "original": {"max_position_embeddings": 8192, "rope_parameters": {...}},   # RoPE families
              or {"max_position_embeddings": 1024, "positions": 1024},          # learned tables
     "tables": {"wpe": {}, ...},          # learned tables: per table what reloading it needs
     "base": {...}}                       # the record this patch is stacked on (no format_version of its own)
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass

RECORD_ATTR = "hf_posenc"  # the config field that holds the record (saved in config.json)
FORMAT_VERSION = 1  # the newest record format this code reads and the one it writes


@dataclass(frozen=True)
class Original:
    """The config fields a patch replaced, as they were before it."""

    max_position_embeddings: int
    rope_parameters: dict | None = None  # RoPE families: the rope_parameters before the patch
    positions: int | None = None  # learned tables: the positions the table held

    def to_dict(self) -> dict:
        return {f.name: copy.deepcopy(getattr(self, f.name)) for f in dataclasses.fields(self)
                if getattr(self, f.name) is not None}


@dataclass(frozen=True)
class TableRecord:
    """What reloading one replaced position table needs beyond the checkpoint's tensors."""

    scale: float | None = None  # sinusoidal init="scaled": the factor on the sinusoid
    fit_relative_error: float | None = None  # sinusoidal init="fit": how close the fit came to the learned table

    def to_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if getattr(self, f.name) is not None}


@dataclass(frozen=True)
class PatchRecord:
    """One patch: the family and method that made it, the method's parameters, what it replaced."""

    family: str
    mechanism: str
    method: str
    params: dict
    original: Original
    tables: dict[str, TableRecord] | None = None  # learned-table families, by table path
    base: PatchRecord | None = None  # the patch this one is stacked on (a RoPE method on a learned -> rope swap)
    format_version: int = FORMAT_VERSION  # the format it was read in; to_dict writes the current one

    def to_dict(self) -> dict:
        """The JSON-ready dict written into the config (and so into config.json), in the current format."""
        return {"format_version": FORMAT_VERSION, **self._body()}

    def _body(self) -> dict:
        out = {"family": self.family, "mechanism": self.mechanism, "method": self.method,
               "params": copy.deepcopy(self.params), "original": self.original.to_dict()}
        if self.tables is not None:
            out["tables"] = {path: table.to_dict() for path, table in self.tables.items()}
        if self.base is not None:
            out["base"] = self.base._body()
        return out


def recorded_family(config) -> str | None:
    """The family a config's record names, unchecked (None without one): for finding the family of a model whose
    patch removed what the family looks for. Every reader of the record itself goes through
    `record_reader.read_record`."""
    raw = getattr(config, RECORD_ATTR, None)
    return raw.get("family") if isinstance(raw, dict) else None


def attach(config, record: PatchRecord) -> None:
    """Write `record` into `config` (the patched model's own copy)."""
    setattr(config, RECORD_ATTR, record.to_dict())


def detach(config) -> None:
    """Remove any record from `config` (a copy that is to describe the model before the patch)."""
    if hasattr(config, RECORD_ATTR):
        delattr(config, RECORD_ATTR)
