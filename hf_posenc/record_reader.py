"""A saved patch record read back: `read_record` checks the dict a config carries (hf_posenc/record.py) against
the registered families and methods and returns the typed `PatchRecord`; `method_class`, `method_config` and
`family_of` turn its names back into the classes that made it. Every reader of a record goes through here, so a
malformed one (not a dict, a key missing or unknown, an unknown family or method, parameters the method refuses)
or one of a newer format is refused the same way everywhere. It knows both tables, so it sits above the
interfaces and the mechanisms and below the families (docs/ARCHITECTURE.md)."""

from __future__ import annotations

import copy
import dataclasses

from .config import METHODS, MethodConfig
from .errors import CheckpointRecordError, PosEncError
from .family import FAMILIES, Family
from .record import FORMAT_VERSION, RECORD_ATTR, Original, PatchRecord, TableRecord


def method_class(record: PatchRecord) -> type[MethodConfig]:
    return METHODS[record.method]  # a record is checked when read: its method is registered


def method_config(record: PatchRecord) -> MethodConfig:
    """The method config the patch was made with (parameters a method no longer has are left out)."""
    cls = method_class(record)
    names = {f.name for f in dataclasses.fields(cls)}
    return cls.from_dict({k: v for k, v in record.params.items() if k in names})


def family_of(record: PatchRecord) -> Family:
    return FAMILIES[record.family]


def read_record(config, source: str | None = None) -> PatchRecord | None:
    """The record `config` carries (None when it carries none), checked, a refusal naming `source` (the
    config.json it came from; by default the model's own name)."""
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
    family = FAMILIES.get(raw["family"], None) if isinstance(raw["family"], str) else None
    if family is None:
        refuse(f"names an unknown family {raw['family']!r}; known: {', '.join(FAMILIES)}")
    if raw["mechanism"] != family.mechanism:
        refuse(f"says mechanism {raw['mechanism']!r}, but family {family.name!r} has {family.mechanism!r} positions")
    method = METHODS.get(raw["method"], None) if isinstance(raw["method"], str) else None
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
