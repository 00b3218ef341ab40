"""The checks the refusal tests share, each module's table of bad inputs living in that module's test file:

- `one_line_refusal`: the one check every front end's refusal meets (the CLI's verbs, the recipes): exit code 2,
  one `error: ...` line on stderr, the last, and no traceback;
- `snapshot`: a folder's names, sizes and mtimes, so a write, a touch or a delete shows;
- library cases (`Case`, `refused_clearly_and_unchanged`): a call given a tiny model built by name or a folder
  set up to be wrong; refused with the error class and words the case names, and nothing changed (the model's
  tensors and config, the files on disk); with the checkpoints to break that the cases set up;
- Python API cases (`CallCase`, `refused_in_one_line`): a call on what `tok`, `llama`, `encoder`, `table` and
  `dynamic` build once, refused in one line with the error class and words the case names;
- command-line cases (`root`, `check_refusal`, `shell_refusal`): argv against a folder of tiny models, a corpus and
  bad configs, refused in one line with exit code 2 and nothing on disk changed, in this process or in a shell;
- GGUF files (`ggufs`, `cache`, `gguf_refusal`): tiny GGUF files, whole or damaged, and the command-line refusals
  of them, refused before the weights load where the header decides."""

from __future__ import annotations

import hashlib
import json
import os
import re
import struct
import subprocess
from dataclasses import dataclass
from functools import cache as built_once
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable

import pytest
import torch
from safetensors.torch import load_file, save_file
from test_learned import tiny
from tiny import TINY_TEXT_VOCAB, save_text_models, tiny_model, tiny_tokenizer, write_corpus
from torch import nn

import hf_posenc as hp
from hf_posenc.methods.learned import ORIGINAL_TABLE
from hf_posenc.plan import is_patched

ROOT = Path(__file__).resolve().parents[1]


def one_line_refusal(capsys, main, argv, *, alone: bool = False) -> str:
    """Run `main(argv)`, which must refuse; return its `error:` line. `alone`: nothing else on stderr either."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as stop:
        main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert stop.value.code == 2, (stop.value.code, err)
    assert err and err[-1].startswith("error: ") and "Traceback" not in "\n".join(err), err
    assert sum(line.startswith("error: ") for line in err) == 1, err
    assert not alone or len(err) == 1, err
    return err[-1]


def one_error_line(argv, capsys, *, alone=True) -> str:
    """`one_line_refusal` of `hf-posenc argv`."""
    from hf_posenc import cli

    return one_line_refusal(capsys, cli.main, argv, alone=alone)


def snapshot(folder: Path) -> dict:
    return {str(p.relative_to(folder)): (p.is_dir(), p.stat().st_size, p.stat().st_mtime_ns)
            for p in [folder, *folder.rglob("*")]}


def refused_as(call, error, pattern) -> None:
    """`call()` raises `error` with a message `pattern` (a regex) finds."""
    with pytest.raises(error, match=pattern):
        call()


# -- library cases: a call on a tiny model or a folder set up to be wrong, and nothing changed -----------------------

def build(kind: str | None):
    if kind is None:
        return None
    if kind == "llama":
        return tiny_model()
    if kind == "llama_yarn":
        return hp.patch(tiny_model(), "yarn", factor=2)
    return tiny(kind)


def model_state(model) -> tuple[dict, dict] | None:
    if not isinstance(model, nn.Module):
        return None
    return {k: v.detach().clone() for k, v in model.state_dict().items()}, model.config.to_dict()


def files_state(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def assert_same_model(before, after) -> None:
    if before is None:
        return
    (tensors, config), (tensors_after, config_after) = before, after
    assert config_after == config
    assert tensors_after.keys() == tensors.keys()
    assert all(torch.equal(tensors_after[k], v) for k, v in tensors.items())


def saved(path: Path, kind: str, method: str, **params) -> Path:
    """`kind` patched with `method`, saved in path / "ck"."""
    model = build(kind)
    hp.patch(model, method, **params)
    model.save_pretrained(path / "ck")
    return path / "ck"


def edit_config(folder: Path, edit: Callable[[dict], None]) -> Path:
    config = json.loads((folder / "config.json").read_text())
    edit(config)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def edited_record(kind: str, method: str, params: dict, edit: Callable[[dict], None]):
    """A setup: the saved checkpoint, its config.json edited by `edit(config_dict)`."""
    return lambda path: edit_config(saved(path, kind, method, **params), edit)


def set_record(value):
    return lambda c: c.update(hf_posenc=value)


def set_in(*keys, value):
    def edit(c):
        node = c["hf_posenc"]
        for key in keys[:-1]:
            node = node[key]
        node[keys[-1]] = value
    return edit


def drop(*keys):
    def edit(c):
        node = c["hf_posenc"]
        for key in keys[:-1]:
            node = node[key]
        del node[keys[-1]]
    return edit


def yarn_says_linear(c):
    """The record says linear, rope_parameters (what stock transformers reads) still say yarn."""
    record = c["hf_posenc"]
    record["method"] = "linear"
    record["params"] = {k: v for k, v in record["params"].items()
                        if k in ("max_position_embeddings", "factor", "layer_types", "replace_native")}


def without_original_table(path: Path) -> Path:
    """An alibi GPT-2 checkpoint as hf_posenc saved it before it kept the removed table."""
    folder = saved(path, "gpt2", "alibi")
    weights = load_file(folder / "model.safetensors")
    save_file({k: v for k, v in weights.items() if not k.endswith(ORIGINAL_TABLE)}, folder / "model.safetensors",
              metadata={"format": "pt"})
    return folder


def stacked(path: Path) -> Path:
    model = tiny("gpt2")
    hp.patch(model, "rope")
    hp.patch(model, "yarn", factor=2)
    model.save_pretrained(path / "stacked")
    return path / "stacked"


def broken_record(model):
    model.config.hf_posenc = "yarn"
    return model


def text_file(name: str, content: bytes):
    def setup(path: Path) -> Path:
        (path / name).write_bytes(content)
        return path / name
    return setup


def empty_folder(path: Path) -> Path:
    (path / "empty").mkdir()
    return path / "empty"


def folder_with(name: str):
    def setup(path: Path) -> Path:
        (path / "m").mkdir()
        (path / "m" / name).write_text("{}")
        return path / "m"
    return setup


@dataclass
class Case:
    id: str
    call: Callable[[Any], Any]  # given ctx: ctx.model (built from `model`), ctx.path (from `setup`), ctx.tmp
    error: type
    match: str  # a substring the message must hold
    model: str | None = None
    setup: Callable[[Path], Path] | None = None


def refused_clearly_and_unchanged(case: Case, tmp_path: Path) -> None:
    """The case's call raises its error with its words, and changes nothing: the model (unpatched still, unless the
    case starts from a patched one) and the files under tmp_path."""
    ctx = SimpleNamespace(tmp=tmp_path, model=build(case.model), path=None, loaded=None)
    if case.setup is not None:
        ctx.path = case.setup(tmp_path)
    if case.setup is without_original_table:
        ctx.loaded = hp.from_pretrained(ctx.path)
    subject = ctx.loaded if ctx.loaded is not None else ctx.model
    if case.id == "describe-malformed-record":  # the record is broken first: what must not change is the rest
        broken_record(ctx.model)
    before, files = model_state(subject), files_state(tmp_path)
    with pytest.raises(case.error) as raised:
        case.call(ctx)
    assert case.match in str(raised.value), str(raised.value)
    assert_same_model(before, model_state(subject))
    assert files_state(tmp_path) == files
    if isinstance(subject, nn.Module) and case.id not in ("already-patched", "describe-malformed-record") \
            and ctx.loaded is None:
        assert not is_patched(subject)


# -- Python API cases: a call on models built once, refused in one line ----------------------------------------------

IDS = torch.full((1, 16), 5)
MASK = torch.ones(1, 16, dtype=torch.long)


@built_once
def tok():
    return tiny_tokenizer()


@built_once
def llama():
    return tiny_model(vocab_size=TINY_TEXT_VOCAB, max_position_embeddings=4096)


@built_once
def encoder():
    return tiny("bert", vocab_size=TINY_TEXT_VOCAB)          # a masked LM: no causal head


@built_once
def table():
    return tiny("gpt2", vocab_size=TINY_TEXT_VOCAB)          # a learned table of 32 positions


@built_once
def dynamic():
    return hp.patch(tiny_model(vocab_size=TINY_TEXT_VOCAB), "dynamic", factor=2)


@dataclass
class CallCase:
    id: str
    call: Callable[[], Any]
    error: type
    match: str


def refused_in_one_line(case: CallCase) -> None:
    with pytest.raises(case.error) as raised:
        case.call()
    message = str(raised.value)
    assert case.match in message, message
    assert "\n" not in message


# -- command-line cases: argv against a folder of tiny models, a corpus and bad configs -------------------------------

ROOT_TEXT = "".join(f"Line {i}: the king speaks of {i * 7 % 13} ravens.\n" for i in range(60))


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    """A tiny Llama and a tiny GPT-2 (each with a byte-level tokenizer), a corpus folder, a plain file,
    YAML configs: everything a case may name, in one folder that is snapshotted around each case."""
    path = tmp_path_factory.mktemp("bad_inputs")
    save_text_models(path, llama=tiny_model(vocab_size=TINY_TEXT_VOCAB),
                     gpt2=tiny_model("gpt2", vocab_size=TINY_TEXT_VOCAB, bos_token_id=0, eos_token_id=0),
                     patched=hp.patch(tiny_model(vocab_size=TINY_TEXT_VOCAB), "yarn", factor=2))
    write_corpus(path / "corpus", ROOT_TEXT)
    (path / "afile").write_text("not a model")
    (path / "full").mkdir()
    (path / "full" / "notes.txt").write_text("somebody's notes")
    (path / "sub").mkdir()
    yamls = {
        "tab": "model:\n\tname: x\n",
        "scalar_variants": "eval:\n  variants: none\n  perplexity_lengths: [64]\n",
        "scalar_targets": "eval:\n  max_position_embeddings: 16384\n  perplexity_lengths: [64]\n",
        "wrong_type": "eval:\n  perplexity_lengths: [abc]\n",
        "bool_count": "eval:\n  trials: true\n  passkey_lengths: [128]\n",
        "not_mapping": "- variants\n- none\n",
        "unknown_key": "eval:\n  curve_lenght: 4096\n",
        "no_targets": "eval:\n  max_position_embeddings: []\n  perplexity_lengths: [64]\n",
        "no_variants": "eval:\n  variants: []\n  perplexity_lengths: [64]\n",
        "zero_length": "eval:\n  perplexity_lengths: [0]\n",
    }
    for name, text in yamls.items():
        (path / f"{name}.yaml").write_text(text)
    (path / "results").mkdir()
    (path / "results" / "results.json").write_text("{not json")
    # GGUF headers: one cut inside its first key, one whose array claims 2^61 elements (a reader that trusts the
    # count hangs or asks for exabytes)
    key = struct.pack("<Q", 20) + b"general.architecture"
    (path / "cut.gguf").write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + key[:12])
    (path / "huge.gguf").write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + key + struct.pack("<IIQ", 9, 4, 2**61))
    return path


def fill(argv: list[str], root: Path) -> list[str]:
    return [a.format(root=root, out=root / "out") for a in argv]


def refused(run, argv, capsys) -> tuple[int, list[str]]:
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_:
        run(argv)
    return exit_.value.code, capsys.readouterr().err.strip().splitlines()


def check_refusal(run, argv, pattern, root, capsys, *, alone=True):
    before = snapshot(root)
    code, lines = refused(run, fill(argv, root), capsys)
    assert code == 2
    assert "Traceback" not in "\n".join(lines)
    errors = [line for line in lines if line.startswith("error: ")]
    assert len(errors) == 1 and lines[-1] == errors[0], lines
    if alone:
        assert lines == errors, lines
    assert re.search(pattern, errors[0]), errors[0]
    assert snapshot(root) == before  # nothing written, deleted or changed
    assert not (root / "out").exists()


def shell_refusal(argv, pattern, root) -> None:
    """argv run as a real process, from root/sub: exit code 2, one `error:` line, nothing on stdout, nothing
    under root changed: what a shell sees."""
    before = snapshot(root)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run(fill(argv, root), capture_output=True, text=True, env=env, timeout=300, cwd=root / "sub")
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    assert re.search(pattern, lines[0]) and proc.stdout == ""
    assert snapshot(root) == before


# -- GGUF files: reading a user's file never ends in a traceback; patch X.gguf --out Y.gguf checks the header first

def write_gguf_file(path, *, heads=2, width=16, layers=1, tensors="all", scaling=None):
    """A tiny llama GGUF file: `tensors` "all" (a whole model), "embedding" (one tensor), "wrong-shape"."""
    import gguf
    import numpy as np

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
    """Tiny GGUF files (written with the gguf package: skipped without it), whole and damaged, and the outputs a
    case may name: a folder called folder.gguf, a file taken.gguf already there."""
    pytest.importorskip("gguf")
    root = tmp_path_factory.mktemp("ggufs")
    write_gguf_file(root / "good.gguf")
    (root / "cut.gguf").write_bytes((root / "good.gguf").read_bytes()[:-4096])   # the header whole, the data not
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
    from hf_posenc import loading

    monkeypatch.setattr(loading, "CACHE_DIR", tmp_path / "cache")
    return tmp_path / "cache"


GGUF_PATCH = ["patch", "{root}/good.gguf", "--method", "yarn", "--factor", "2"]


def gguf_refusal(argv, pattern, early, ggufs, cache, capsys, monkeypatch) -> None:
    """`hf-posenc argv` on the GGUF files refuses in one line (alone on stderr when `early`), writes nothing beside
    them and caches no partial model; `early`: what the header decides is refused before any weight is read."""
    import gguf

    from hf_posenc import loading

    if early:  # what the header decides is refused before any weight is read or de-quantized
        monkeypatch.setattr(loading, "load_model", lambda *a, **k: pytest.fail("the weights were loaded"))
        monkeypatch.setattr(gguf, "GGUFReader", lambda *a, **k: pytest.fail("the whole file was read"))
    before = snapshot(ggufs)
    line = one_error_line([a.format(root=ggufs) for a in argv], capsys, alone=early)
    assert re.search(pattern, line), line
    assert snapshot(ggufs) == before
    assert not cache.exists() or not any(cache.rglob("config.json"))  # no partial model cached
