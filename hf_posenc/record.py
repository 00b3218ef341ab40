"""The checkpoint contract: what a model's config keeps of an hf_posenc patch, in one place.

A patch writes a `PatchRecord` into the patched config as the plain dict `config.hf_posenc` (plain, since
transformers writes config attributes to config.json as they are); `hp.from_pretrained` reads it back to put
the patch on the loaded checkpoint again. This module is the only one that builds or reads that dict:
`attach` writes it, `read_record` checks it and returns the typed record, `detach` removes it.

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
from typing import TYPE_CHECKING

from .config import METHODS
from .errors import CheckpointRecordError, PosEncError
from .family import FAMILIES

if TYPE_CHECKING:
    from .config import MethodConfig
    from .family import Family

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

    def method_class(self) -> type[MethodConfig]:
        return METHODS[self.method]  # a record is checked when read: its method is registered

    def method_config(self) -> MethodConfig:
        """The method config the patch was made with (parameters a method no longer has are left out)."""
        cls = self.method_class()
        names = {f.name for f in dataclasses.fields(cls)}
        return cls.from_dict({k: v for k, v in self.params.items() if k in names})

    def family_adapter(self) -> Family:
        return FAMILIES[self.family]


def recorded_family(config) -> str | None:
    """The family a config's record names, unchecked (None without one): for finding the family of a model whose
    patch removed what the family looks for. Every reader of the record itself goes through `read_record`."""
    raw = getattr(config, RECORD_ATTR, None)
    return raw.get("family") if isinstance(raw, dict) else None


def attach(config, record: PatchRecord) -> None:
    """Write `record` into `config` (the patched model's own copy)."""
    setattr(config, RECORD_ATTR, record.to_dict())


def detach(config) -> None:
    """Remove any record from `config` (a copy that is to describe the model before the patch)."""
    if hasattr(config, RECORD_ATTR):
        delattr(config, RECORD_ATTR)


def read_record(config, source: str | None = None) -> PatchRecord | None:
    """The record `config` carries (None when it carries none), checked: every reader of a record goes
    through here, so one that is malformed (not a dict, a key missing or unknown, an unknown family or
    method, parameters of the wrong type) or of a newer format is refused the same way everywhere, naming
    `source` (the config.json it came from; by default the model's own name)."""
    raw = getattr(config, RECORD_ATTR, None) if config is not None else None
    if raw is None:
        return None
    if source is None:
        name = getattr(config, "_name_or_path", "")
        source = f"{name}/config.json" if name else "this model's config"
    version = _format_version(raw, source)
    return _parse(raw, source, RECORD_ATTR, version)


_KEYS = ("family", "mechanism", "method", "params", "original")
_OPTIONAL_KEYS = ("tables", "base")


def _refuser(source: str, field: str):
    def refuse(what: str):
        raise CheckpointRecordError(
            f"{source}: its {field!r} record {what}. hf_posenc writes that record when it saves a patched model "
            f"and restores the patch from it; this one was edited or written by hand. Save the model again from "
            f"the patched one, or delete the field to load the checkpoint as stock transformers reads it"
        )
    return refuse


def _format_version(raw, source: str) -> int:
    refuse = _refuser(source, RECORD_ATTR)
    if not isinstance(raw, dict):
        refuse(f"must be a dict, got {type(raw).__name__} {str(raw)[:80]!r}")
    version = raw.get("format_version", 1)  # records written before the key existed are format 1
    if not _is_count(version):
        refuse(f"has format_version {version!r}; a format version is an int >= 1")
    if version > FORMAT_VERSION:
        raise CheckpointRecordError(
            f"{source}: its {RECORD_ATTR!r} record has format_version {version}, written by a newer hf_posenc; this "
            f"hf_posenc reads record formats up to {FORMAT_VERSION}. Upgrade hf_posenc to load this checkpoint "
            f"with its patch"
        )
    return version


def _parse(raw, source: str, field: str, version: int) -> PatchRecord:
    refuse = _refuser(source, field)
    if not isinstance(raw, dict):
        refuse(f"must be a dict, got {type(raw).__name__} {str(raw)[:80]!r}")
    missing = [key for key in _KEYS if key not in raw]
    if missing:
        refuse(f"lacks the key(s) {missing}")
    known = (*_KEYS, *_OPTIONAL_KEYS, *(("format_version",) if field == RECORD_ATTR else ()))
    unknown = sorted(str(key) for key in raw if key not in known)
    if unknown:
        refuse(f"has key(s) {unknown} that record format {version} does not have; it has {list(known)}")
    family = FAMILIES.get(raw["family"]) if isinstance(raw["family"], str) else None
    if family is None:
        refuse(f"names an unknown family {raw['family']!r}; known: {', '.join(FAMILIES)}")
    if raw["mechanism"] != family.mechanism:
        refuse(f"says mechanism {raw['mechanism']!r}, but family {family.name!r} has {family.mechanism!r} positions")
    method = METHODS.get(raw["method"]) if isinstance(raw["method"], str) else None
    if method is None:
        refuse(f"names an unknown method {raw['method']!r}; known: {', '.join(sorted(METHODS))}")
    if family.mechanism not in method.mechanisms:
        refuse(f"names method {method.name!r}, which does not apply to {family.mechanism} positions")
    params = raw["params"]
    if not isinstance(params, dict):
        refuse(f"has params {params!r}, not a dict")
    names = {f.name for f in dataclasses.fields(method)}
    try:
        method.from_dict({k: v for k, v in params.items() if k in names})
    except PosEncError as err:
        refuse(f"has parameters method {method.name!r} refuses ({err})")
    original = _parse_original(raw["original"], family.mechanism, refuse)
    tables = raw.get("tables")
    if (family.mechanism == "learned" or tables is not None) and not (
            isinstance(tables, dict) and all(isinstance(t, dict) for t in tables.values())):
        refuse(f"has 'tables' {tables!r}, not a dict of the position tables it replaced")
    if tables is not None:
        tables = {path: _parse_table(path, info, refuse) for path, info in tables.items()}
    base = raw.get("base")
    if base is not None:
        base = _parse(base, source, f"{field}.base", version)
    return PatchRecord(family=family.name, mechanism=family.mechanism, method=method.name,
                       params=copy.deepcopy(params), original=original, tables=tables, base=base,
                       format_version=version)


def _parse_original(original, mechanism: str, refuse) -> Original:
    if not isinstance(original, dict) or not _is_count(original.get("max_position_embeddings")):
        refuse(f"has 'original' {original!r}, which needs the original max_position_embeddings (an int > 0)")
    if mechanism == "rope" and not isinstance(original.get("rope_parameters"), dict):
        refuse(f"has 'original' {original!r}, which needs the original rope_parameters (a dict)")
    if mechanism == "learned" and not _is_count(original.get("positions")):
        refuse(f"has 'original' {original!r}, which needs the positions the original table held (an int > 0)")
    fields = [f.name for f in dataclasses.fields(Original)]
    unknown = sorted(str(key) for key in original if key not in fields)
    if unknown:
        refuse(f"has 'original' keys {unknown} it does not know; it has {fields}")
    return Original(**copy.deepcopy(original))


def _parse_table(path, info: dict, refuse) -> TableRecord:
    fields = [f.name for f in dataclasses.fields(TableRecord)]
    for key, value in info.items():
        if key not in fields:
            refuse(f"has table {path!r} with the key {key!r}; a table keeps only {fields}")
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            refuse(f"has table {path!r} with {key} {value!r}, not a number")
    return TableRecord(**{k: float(v) for k, v in info.items()})


def _is_count(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0
