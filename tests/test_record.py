"""The checkpoint contract (hf_posenc/record.py): what config.hf_posenc holds of a patch, written as format 1,
read back as the typed PatchRecord; records written before the format had a version still load; malformed
records and records of a newer format are refused, naming the config.json, as are records that lie (edited apart
from the rope_parameters or the tables they describe) or are malformed as a hostile new user would write them.

tests/data/record_v0_*.json hold the `hf_posenc` field of config.json exactly as hf_posenc wrote it before
format_version existed, for the tiny models built here (`CASES` below, the same models and patches)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from refusals import (Case, broken_record, drop, edit_config, edited_record, files_state, refused_clearly_and_unchanged,
                      set_in, set_record, stacked, text_file, yarn_says_linear)
from test_learned import tiny
from tiny import tiny_model

import hf_posenc as hp
from hf_posenc.corpora import load_corpus
from hf_posenc.record import FORMAT_VERSION, RECORD_ATTR, PatchRecord, TableRecord
from hf_posenc.record_reader import method_config, read_record
from hf_posenc.registry import find_family, get_method

DATA = Path(__file__).parent / "data"
PACKAGE = Path(hp.__file__).parent

# name -> (the tiny model, the patches applied in turn); names match tests/data/record_v0_<name>.json
CASES = {
    "yarn_llama": (tiny_model, [("yarn", {"factor": 2})]),  # RoPE method, stock checkpoint
    "dynamic_yarn_llama": (tiny_model, [("dynamic_yarn", {"factor": 2})]),  # RoPE method only hf_posenc loads
    "interpolate_gpt2": (lambda: tiny("gpt2"), [("interpolate", {"factor": 2})]),  # learned table
    "alibi_gpt2": (lambda: tiny("gpt2"), [("alibi", {})]),  # attention method
    "rope_yarn_gpt2": (lambda: tiny("gpt2"), [("rope", {}), ("yarn", {"factor": 2})]),  # stacked
}


def patched(name: str):
    build, steps = CASES[name]
    model = build()
    for method, params in steps:
        hp.patch(model, method, **params)
    return model


def logits(model, n: int = 24) -> torch.Tensor:
    ids = torch.randint(3, 90, (1, n), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        return model(ids).logits


def config_with(raw) -> SimpleNamespace:
    return SimpleNamespace(**{RECORD_ATTR: raw})


def edit_record(folder: Path, edit) -> None:
    edit_config(folder, lambda config: edit(config[RECORD_ATTR]))


# -- round trip ------------------------------------------------------------------------------------

def expected_fields(build, method: str, params: dict) -> dict:
    """What the record of `method` on the model `build()` gives must hold, from the unpatched model."""
    model = build()
    family = find_family(model)
    config = model.config.get_text_config()
    original = {"max_position_embeddings": config.max_position_embeddings}
    if family.mechanism == "rope":  # no native scaling here: the original context is max_position_embeddings
        original["rope_parameters"] = config.rope_parameters
        context = config.max_position_embeddings
    else:
        context = original["positions"] = family.positions(model)
    cfg = get_method(method).from_dict(params).resolve(context)
    tables = [t.path for t in family.tables(model)] if family.mechanism == "learned" else None
    return {"family": family.name, "mechanism": family.mechanism, "method": method, "config": cfg,
            "original": original, "tables": tables}


def check_fields(record: PatchRecord, expected: dict) -> None:
    assert (record.family, record.mechanism, record.method) == (
        expected["family"], expected["mechanism"], expected["method"])
    assert method_config(record) == expected["config"]
    assert record.params == json.loads(json.dumps(expected["config"].to_dict()))
    original = record.original
    assert original.max_position_embeddings == expected["original"]["max_position_embeddings"]
    assert original.rope_parameters == expected["original"].get("rope_parameters")
    assert original.positions == expected["original"].get("positions")
    assert (None if record.tables is None else sorted(record.tables)) == expected["tables"]


@pytest.mark.parametrize("name", list(CASES))
def test_round_trip_gives_the_typed_fields_of_the_patch(tmp_path, name):
    build, steps = CASES[name]
    model = patched(name)
    record = read_record(model.config)
    # the top record is the last patch, its base the one before it (the learned -> rope swap)
    expected = [expected_fields(build, *steps[0])]
    if len(steps) == 2:
        swapped = build()
        hp.patch(swapped, *steps[0][:1], **steps[0][1])
        expected.insert(0, expected_fields(lambda: swapped, *steps[1]))
    for level in expected:
        check_fields(record, level)
        record = record.base
    assert record is None

    record = read_record(model.config)
    written = model.config.hf_posenc
    assert written["format_version"] == FORMAT_VERSION == 1
    assert written == record.to_dict() and read_record(config_with(json.loads(json.dumps(written)))) == record
    model.save_pretrained(tmp_path)
    on_disk = json.loads((tmp_path / "config.json").read_text())[RECORD_ATTR]
    assert on_disk == json.loads(json.dumps(written))
    if len(steps) == 2:
        assert "format_version" not in on_disk["base"]  # one version for the whole record
    loaded = hp.from_pretrained(tmp_path)
    assert read_record(loaded.config) == record
    assert torch.equal(logits(loaded), logits(model))


def test_a_sinusoidal_fit_keeps_its_table_record(tmp_path):
    model = tiny("gpt2")
    hp.patch(model, "sinusoidal", factor=2, init="fit")
    record = read_record(model.config)
    (path, table), = record.tables.items()
    assert path == "wpe" and table.scale is None
    assert table.fit_relative_error == hp.describe(model)["fit_relative_error"] > 0
    model.save_pretrained(tmp_path)
    loaded = hp.from_pretrained(tmp_path)
    assert read_record(loaded.config).tables == {"wpe": TableRecord(fit_relative_error=table.fit_relative_error)}
    assert torch.equal(logits(loaded), logits(model))


# -- records written before format_version ---------------------------------------------------------

@pytest.mark.parametrize("name", list(CASES))
def test_a_record_of_the_earlier_format_reads_as_format_1(name):
    raw = json.loads((DATA / f"record_v0_{name}.json").read_text())
    assert "format_version" not in raw
    record = read_record(config_with(raw))
    assert record.format_version == 1
    assert record.to_dict() == {"format_version": 1, **raw}  # the same record, now with its version


@pytest.mark.parametrize("name", list(CASES))
def test_a_checkpoint_of_the_earlier_format_loads_with_the_same_logits(tmp_path, name):
    model = patched(name)
    model.save_pretrained(tmp_path)
    raw = json.loads((DATA / f"record_v0_{name}.json").read_text())
    edit_record(tmp_path, lambda r: (r.clear(), r.update(raw)))
    assert "format_version" not in json.loads((tmp_path / "config.json").read_text())[RECORD_ATTR]
    loaded = hp.from_pretrained(tmp_path)
    assert torch.equal(logits(loaded), logits(model))
    assert hp.describe(loaded) == hp.describe(model)
    assert loaded.config.hf_posenc == {"format_version": 1, **raw}  # saved again, it is written as format 1


# -- refused ---------------------------------------------------------------------------------------

def test_a_newer_format_is_refused_naming_the_version(tmp_path):
    model = patched("yarn_llama")
    model.save_pretrained(tmp_path)
    edit_record(tmp_path, lambda r: r.update(format_version=FORMAT_VERSION + 1, new_key={"a": 1}))
    files = files_state(tmp_path)
    with pytest.raises(hp.CheckpointRecordError) as raised:
        hp.from_pretrained(tmp_path)
    message = str(raised.value)
    assert str(tmp_path / "config.json") in message
    assert f"format_version {FORMAT_VERSION + 1}" in message and "Upgrade hf_posenc" in message
    assert files_state(tmp_path) == files
    model.config.hf_posenc = {**model.config.hf_posenc, "format_version": 2}
    with pytest.raises(hp.CheckpointRecordError, match="format_version 2, written by a newer hf_posenc"):
        hp.describe(model)


MALFORMED = [
    ("yarn_llama", set_in("format_version", value="1"), "has format_version '1'; a format version is an int >= 1"),
    ("yarn_llama", set_in("format_version", value=0), "has format_version 0"),
    ("yarn_llama", set_in("format_version", value=True), "has format_version True"),
    ("yarn_llama", set_in("extra", value=1), "has key(s) ['extra'] that record format 1 does not have"),
    ("yarn_llama", set_in("original", "rope_theta", value=1.0), "has 'original' keys ['rope_theta']"),
    ("interpolate_gpt2", set_in("original", "positions", value=None), "the positions the original table held"),
    ("interpolate_gpt2", set_in("tables", "wpe", "scale", value="1"), "has table 'wpe' with scale '1', not a number"),
    ("interpolate_gpt2", set_in("tables", "wpe", "rows", value=3), "has table 'wpe' with the key 'rows'"),
    ("interpolate_gpt2", set_in("tables", value={"nosuch": {}}), "names the position table(s) ['nosuch']"),
    ("yarn_llama", set_in("tables", value=[1]), "has 'tables' [1], not a dict of the position tables"),
    ("rope_yarn_gpt2", set_in("base", "format_version", value=1), "'hf_posenc.base' record has key(s) ['format_version']"),
]


@pytest.mark.parametrize("name, edit, match", MALFORMED, ids=[m[2][:40] for m in MALFORMED])
def test_a_malformed_record_is_refused_naming_the_file(tmp_path, name, edit, match):
    patched(name).save_pretrained(tmp_path)
    edit_config(tmp_path, edit)
    files = files_state(tmp_path)
    with pytest.raises(hp.CheckpointRecordError) as raised:
        hp.from_pretrained(tmp_path)
    assert match in str(raised.value) and str(tmp_path) in str(raised.value), str(raised.value)
    assert files_state(tmp_path) == files


def test_only_the_record_modules_read_or_write_the_raw_record():
    """The contract lives in two modules: record.py writes config.hf_posenc, record_reader.py reads it; no other
    one touches the dict (plan.py only asks whether a config carries one)."""
    raw_access = re.compile(r"\bRECORD_ATTR\b|\.hf_posenc\s*(\[|=[^=])|\[[\"']hf_posenc[\"']\]")
    offenders = [f"{path.relative_to(PACKAGE)}: {match.group(0)!r}"
                 for path in sorted(PACKAGE.rglob("*.py"))
                 if path.name not in ("record.py", "record_reader.py", "plan.py")
                 for match in raw_access.finditer(path.read_text())]
    assert not offenders, offenders


# -- records that lie or are malformed, as a hostile new user would write them: refused clearly, nothing changed ------

YARN_RECORD = ("llama", "yarn", {"factor": 2})
RECORD_CASES = [
    Case("record-linear-but-rope-parameters-yarn", lambda c: hp.from_pretrained(c.path), hp.CheckpointRecordError,
         "and its rope_parameters disagree", setup=edited_record(*YARN_RECORD, yarn_says_linear)),
    Case("record-factor-edited", lambda c: hp.from_pretrained(c.path), hp.CheckpointRecordError,
         "'factor': 3.0", setup=edited_record(*YARN_RECORD, lambda r: r["hf_posenc"]["params"].update(
             factor=3.0, max_position_embeddings=192))),
    Case("record-a-string", lambda c: hp.from_pretrained(c.path), hp.CheckpointRecordError,
         "must be a dict, got str 'yarn'", setup=edited_record(*YARN_RECORD, set_record("yarn"))),
    Case("record-a-list", lambda c: hp.from_pretrained(c.path), hp.CheckpointRecordError, "must be a dict, got list",
         setup=edited_record(*YARN_RECORD, set_record(["yarn"]))),
    Case("record-empty", lambda c: hp.from_pretrained(c.path), hp.CheckpointRecordError, "lacks the key(s)",
         setup=edited_record(*YARN_RECORD, set_record({}))),
    Case("record-without-family", lambda c: hp.from_pretrained(c.path), hp.CheckpointRecordError,
         "lacks the key(s) ['family']", setup=edited_record(*YARN_RECORD, drop("family"))),
    Case("record-without-params", lambda c: hp.from_pretrained(c.path), hp.CheckpointRecordError,
         "lacks the key(s) ['params']", setup=edited_record(*YARN_RECORD, drop("params"))),
    Case("record-unknown-family", lambda c: hp.from_pretrained(c.path), hp.CheckpointRecordError,
         "unknown family 'nosuch'", setup=edited_record(*YARN_RECORD, set_in("family", value="nosuch"))),
    Case("record-unknown-method", lambda c: hp.from_pretrained(c.path), hp.CheckpointRecordError,
         "unknown method 'nosuch'", setup=edited_record(*YARN_RECORD, set_in("method", value="nosuch"))),
    Case("record-method-not-a-str", lambda c: hp.from_pretrained(c.path), hp.CheckpointRecordError,
         "unknown method 3", setup=edited_record(*YARN_RECORD, set_in("method", value=3))),
    Case("record-wrong-mechanism", lambda c: hp.from_pretrained(c.path), hp.CheckpointRecordError,
         "says mechanism 'learned'", setup=edited_record(*YARN_RECORD, set_in("mechanism", value="learned"))),
    Case("record-method-of-another-mechanism", lambda c: hp.from_pretrained(c.path), hp.CheckpointRecordError,
         "does not apply to rope positions",
         setup=edited_record(*YARN_RECORD, set_in("method", value="interpolate"))),
    Case("record-params-a-list", lambda c: hp.from_pretrained(c.path), hp.CheckpointRecordError,
         "has params [1], not a dict", setup=edited_record(*YARN_RECORD, set_in("params", value=[1]))),
    Case("record-param-of-the-wrong-type", lambda c: hp.from_pretrained(c.path), hp.CheckpointRecordError,
         "factor must be a number, got '2'", setup=edited_record(*YARN_RECORD, set_in("params", "factor", value="2"))),
    Case("record-without-original-rope", lambda c: hp.from_pretrained(c.path), hp.CheckpointRecordError,
         "needs the original rope_parameters", setup=edited_record(*YARN_RECORD, drop("original", "rope_parameters"))),
    Case("record-original-context-a-str", lambda c: hp.from_pretrained(c.path), hp.CheckpointRecordError,
         "needs the original max_position_embeddings",
         setup=edited_record(*YARN_RECORD, set_in("original", "max_position_embeddings", value="64"))),
    Case("record-learned-tables-a-list", lambda c: hp.from_pretrained(c.path), hp.CheckpointRecordError,
         "not a dict of the position tables", setup=edited_record("gpt2", "alibi", {}, set_in("tables", value=["wpe"]))),
    Case("record-stacked-base-malformed", lambda c: hp.from_pretrained(c.path), hp.CheckpointRecordError,
         "'hf_posenc.base' record lacks the key(s) ['method']",
         setup=lambda p: edit_config(stacked(p), drop("base", "method"))),
    Case("describe-malformed-record", lambda c: hp.describe(broken_record(c.model)), hp.CheckpointRecordError,
         "must be a dict, got str", "llama"),
]


@pytest.mark.parametrize("case", RECORD_CASES, ids=[c.id for c in RECORD_CASES])
def test_bad_input_is_refused_clearly_and_changes_nothing(case, tmp_path):
    refused_clearly_and_unchanged(case, tmp_path)


def test_every_case_names_its_file_where_a_file_is_wrong(tmp_path):
    """Record and corpus errors say which file: the config.json path, the corpus file."""
    folder = edited_record(*YARN_RECORD, set_record("yarn"))(tmp_path)
    with pytest.raises(hp.CheckpointRecordError, match=str(folder / "config.json")):
        hp.from_pretrained(folder)
    bad = text_file("a.txt", b"\xff")(tmp_path)
    with pytest.raises(hp.InvalidInputError, match=str(bad)):
        load_corpus(str(bad))


# A record written by this code loads: every method's record loads back through the strict read, with the same
# logits (tests/test_contracts.py).
