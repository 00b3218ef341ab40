"""A catalogue of bad inputs to `hf-posenc` and recipes/evaluate.py, as a hostile new user would type them.
Each is refused with ONE line `error: ...` on stderr naming what is wrong, exit code 2, no traceback, and
nothing on disk written, deleted or changed (names, sizes and mtimes of every file and folder, before and
after). A few run as real subprocesses, to show what a shell sees."""

import importlib.util
import json
import os
import re
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from hf_posenc import cli
from tiny import TINY_TEXT_VOCAB, save_text_models, tiny_model, write_corpus

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("eval_recipe_bad_inputs", ROOT / "hf_posenc" / "recipes" / "evaluate.py")
recipe = sys.modules["eval_recipe_bad_inputs"] = importlib.util.module_from_spec(spec)
spec.loader.exec_module(recipe)

TEXT = "".join(f"Line {i}: the king speaks of {i * 7 % 13} ravens.\n" for i in range(60))


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    """A tiny Llama and a tiny GPT-2 (each with a byte-level tokenizer), a corpus folder, a plain file,
    YAML configs: everything a case may name, in one folder that is snapshotted around each case."""
    path = tmp_path_factory.mktemp("bad_inputs")
    save_text_models(path, llama=tiny_model(vocab_size=TINY_TEXT_VOCAB),
                     gpt2=tiny_model("gpt2", vocab_size=TINY_TEXT_VOCAB, bos_token_id=0, eos_token_id=0))
    write_corpus(path / "corpus", TEXT)
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


def snapshot(folder: Path) -> dict:
    return {str(p.relative_to(folder)): (p.is_dir(), p.stat().st_size, p.stat().st_mtime_ns)
            for p in [folder, *folder.rglob("*")]}


def fill(argv: list[str], root: Path) -> list[str]:
    return [a.format(root=root, out=root / "out") for a in argv]


def refused(run, argv, capsys) -> tuple[int, list[str]]:
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_:
        run(argv)
    return exit_.value.code, capsys.readouterr().err.strip().splitlines()


EVAL = ["--model.name", "{root}/llama", "--model.dtype", "float32", "--data.corpus", "{root}/corpus",
        "--output_dir", "{out}", "--eval.max_position_embeddings", "256"]
PATCH = ["patch", "{root}/llama", "--method", "yarn"]
DEMO = ["demo", "--model", "{root}/llama", "--corpus", "{root}/corpus/a.txt", "--dtype", "float32", "--out", "{out}"]
PLOT = ["plot", "{root}/llama", "--out", "{out}"]

# (id, argv, what the one error line must say); "{root}" and "{out}" (never created) are filled in
CLI_CASES = [
    ("no-subcommand", [], r"hf-posenc: the following arguments are required: command"),
    ("unknown-subcommand", ["frobnicate"], r"invalid choice: 'frobnicate' \(choose from .*'patch'"),
    ("unknown-flag", ["methods", "--bogus"], r"unrecognized arguments: --bogus"),
    ("inspect-missing-path", ["inspect", "/missing/path"], r"model '/missing/path': no such file or folder"),
    ("inspect-empty", ["inspect", ""], r"the model is empty"),
    ("inspect-a-file", ["inspect", "{root}/afile"], r"model '.*afile' is a file; give a model folder"),
    ("inspect-folder-without-config", ["inspect", "{root}/corpus"], r"'.*corpus' has no config.json"),
    ("inspect-missing-gguf", ["inspect", "/missing/model.gguf"], r"'/missing/model.gguf': no such file"),
    ("inspect-missing-gguf-file", ["inspect", "{root}/llama", "--gguf-file", "nope.gguf"],
     r"--gguf-file 'nope.gguf': no such file in .*llama"),
    ("inspect-truncated-gguf", ["inspect", "{root}/cut.gguf"], r"cut\.gguf: 20 key bytes at byte 32 do not fit .*truncated"),
    ("patch-gguf-with-a-corrupt-count", ["patch", "{root}/huge.gguf", "--method", "yarn", "--factor", "2", "--out",
                                         "{out}"], r"huge\.gguf: 2305843009213693952 array elements .* do not fit"),
    ("patch-missing-path", ["patch", "/missing/path", "--method", "yarn", "--factor", "2", "--out", "{out}"],
     r"model '/missing/path': no such file or folder"),
    ("patch-out-is-a-file", [*PATCH, "--factor", "2", "--out", "{root}/afile"], r"--out .*afile is a file"),
    ("patch-out-under-a-file", [*PATCH, "--factor", "2", "--out", "{root}/afile/x"], r"lies under .*afile, which is a file"),
    ("patch-out-empty", [*PATCH, "--factor", "2", "--out", ""], r"--out is empty"),
    ("patch-out-is-the-input", [*PATCH, "--factor", "2", "--out", "{root}/llama", "--overwrite"],
     r"--out .*llama is or lies inside the input .*llama"),
    ("patch-out-inside-the-input", [*PATCH, "--factor", "2", "--out", "{root}/llama/patched"],
     r"lies inside the input .*llama"),
    ("patch-out-contains-the-input", [*PATCH, "--factor", "2", "--out", "{root}", "--overwrite"],
     r"contains the input .*llama, which replacing it would delete"),
    ("patch-out-not-empty", [*PATCH, "--factor", "2", "--out", "{root}/full"],
     r"output folder .*full exists and is not empty; pass --overwrite"),
    ("patch-unknown-method", ["patch", "{root}/llama", "--method", "yarnn", "--out", "{out}"],
     r"unknown method 'yarnn'; known: .*\byarn\b.*\(did you mean 'yarn'\?\)"),
    ("patch-empty-method", ["patch", "{root}/llama", "--method", "", "--out", "{out}"], r"unknown method ''"),
    ("patch-param-without-value", [*PATCH, "--param", "beta_fast", "--out", "{out}"],
     r"--param: parameters are key=value, got 'beta_fast'"),
    ("patch-param-twice", [*PATCH, "--param", "beta_fast=8", "--param", "beta_fast=16", "--out", "{out}"],
     r"--param beta_fast=8 and --param beta_fast=16 both set beta_fast"),
    ("patch-param-and-flag", [*PATCH, "--param", "factor=3", "--factor", "2", "--out", "{out}"],
     r"--param factor=3 and --factor 2.0 both set factor"),
    ("patch-param-and-mpe-flag", [*PATCH, "--param", "max-position-embeddings=128", "--max-position-embeddings", "256",
                                  "--out", "{out}"], r"both set max_position_embeddings"),
    ("patch-unknown-param", [*PATCH, "--param", "betafast=3", "--out", "{out}"],
     r"unknown parameter\(s\) \['betafast'\] for method 'yarn'; allowed: .*beta_fast"),
    ("patch-factor-zero", [*PATCH, "--factor", "0", "--out", "{out}"], r"factor must be > 0, got 0"),
    ("patch-factor-nan", [*PATCH, "--factor", "nan", "--out", "{out}"], r"factor must be finite, got nan"),
    ("patch-factor-overflow", [*PATCH, "--factor", "1e308", "--out", "{out}"],
     r"factor=1e\+308 means a context of inf tokens .* so factor <= "),
    ("patch-factor-abc", [*PATCH, "--factor", "abc", "--out", "{out}"], r"argument --factor: invalid float value: 'abc'"),
    ("patch-negative-context", [*PATCH, "--max-position-embeddings", "-5", "--out", "{out}"],
     r"max_position_embeddings must be > 0, got -5"),
    ("patch-hierarchical-past-its-reach", ["patch", "{root}/gpt2", "--method", "hierarchical", "--factor", "1000",
                                           "--out", "{out}"], r"hierarchical positions reach n\^2 = 4096 from this 64-position table"),
    ("patch-method-not-applicable", ["patch", "{root}/gpt2", "--method", "yarn", "--factor", "2", "--out", "{out}"],
     r"method 'yarn' applies to rope positions, but this gpt2 model uses learned positions"),
    ("plot-lengths-abc", [*PLOT, "--what", "attention", "--lengths", "abc"],
     r"--lengths must be comma-separated token counts >= 2 .*got 'abc'"),
    ("plot-lengths-one", [*PLOT, "--what", "attention", "--lengths", "1,64"], r"--lengths must be .* got '1,64'"),
    ("plot-queries-zero", [*PLOT, "--what", "attention", "--queries", "0"], r"--queries must be >= 1, got 0"),
    ("plot-unknown-play", [*PLOT, "--what", "attention", "--play", "hamlett"],
     r"--play 'hamlett' is not a play of the shakespeare corpus; plays: .*hamlet"),
    ("plot-unknown-plot", [*PLOT, "--what", "bogus"], r"unknown plot\(s\) \['bogus'\]; known: table"),
    ("plot-empty-what", [*PLOT, "--what", ""], r"unknown plot\(s\) \[''\]"),
    ("plot-unknown-method", [*PLOT, "--what", "wavelengths", "--method", "yarnn"], r"unknown method 'yarnn'"),
    ("plot-missing-model", ["plot", "/missing/path", "--out", "{out}"], r"model '/missing/path': no such file"),
    ("plot-out-is-a-file", ["plot", "{root}/llama", "--out", "{root}/afile"], r"--out .*afile is a file"),
    ("plot-out-inside-the-input", ["plot", "{root}/llama", "--out", "{root}/llama/plots"], r"lies inside the input"),
    ("plot-table-on-rope", [*PLOT, "--what", "table"], r"the table plot does not apply to this llama model's rope positions"),
    ("demo-negative-tokens", [*DEMO, "--tokens=-5"], r"tokens must be >= 2 .*got -5"),
    ("demo-zero-tokens", [*DEMO, "--tokens", "0"], r"tokens must be >= 2 .*got 0"),
    ("demo-huge-tokens", [*DEMO, "--tokens", "100000000"], r"--tokens 100000000 is past the model's context \(64\)"),
    ("demo-negative-long-tokens", [*DEMO, "--tokens", "32", "--long-tokens=-1"],
     r"long_tokens must be 0 \(skip part 2\) or >= 2, got -1"),
    ("demo-passkey-without-part-2", [*DEMO, "--tokens", "32", "--long-tokens", "0", "--passkey"],
     r"passkey hides a key in part 2's tokens, and long_tokens=0 skips part 2"),
    ("demo-long-tokens-past-text", [*DEMO, "--tokens", "32", "--long-tokens", "100000"],
     r"has \d+ tokens; the demo needs 100000"),
    ("demo-long-tokens-too-short-for-passkey", [*DEMO, "--tokens", "32", "--long-tokens", "40", "--passkey"],
     r"length 40 is too short for the retrieval prompt"),
    ("demo-gpt2", ["demo", "--model", "{root}/gpt2", "--tokens", "32", "--long-tokens", "0"],
     r"the demo compares RoPE scaling methods, so it needs a causal LM with rotary positions .* gpt2 causal LM "
     r"with learned positions"),
    ("demo-missing-model", ["demo", "--model", "/missing/path"], r"model '/missing/path': no such file"),
    ("demo-no-methods", [*DEMO, "--methods", ","], r"--methods ',' names nothing"),
    ("demo-unknown-method", [*DEMO, "--methods", "yarn,yarnn"], r"unknown method 'yarnn'"),
    ("demo-learned-method", [*DEMO, "--methods", "yarn,interpolate"],
     r"the demo compares RoPE methods; 'interpolate' applies to learned positions"),
    ("demo-out-is-a-file", [*DEMO[:-1], "{root}/afile"], r"--out .*afile is a file"),
    ("demo-missing-corpus", ["demo", "--model", "{root}/llama", "--corpus", "/missing/*.txt", "--tokens", "32"],
     r"no corpus files match '/missing/\*.txt'"),
]

EVAL_CASES = [
    ("zero-length", [*EVAL, "--eval.perplexity_lengths", "0"], r"perplexity_lengths must hold token counts >= 2, got \[0\]"),
    ("zero-length-yaml", ["--config", "{root}/zero_length.yaml", "--output_dir", "{out}"],
     r"perplexity_lengths must hold token counts >= 2, got \[0\]"),
    ("dtype-float8", [*EVAL, "--model.dtype", "float8", "--eval.perplexity_lengths", "64"],
     r"dtype must be one of auto, float32, bfloat16, float16, got 'float8'"),
    ("framing-unknown", [*EVAL, "--data.framing", "always", "--eval.perplexity_lengths", "64"],
     r"framing must be one of auto, bos, none, got 'always'"),
    ("curve-bucket-zero", [*EVAL, "--eval.curve_length", "128", "--eval.curve_bucket", "0"], r"curve_bucket must be >= 1, got 0"),
    ("curve-length-negative", [*EVAL, "--eval.curve_length", "-5"], r"curve_length must be 0 \(off\) or a token count >= 2"),
    ("count-abc", [*EVAL, "--eval.curve_bucket", "abc"], r"--eval\.curve_bucket must be an integer, got 'abc'"),
    ("yaml-tab", ["--config", "{root}/tab.yaml"], r"tab.yaml is not valid YAML: .*line 2, column 1"),
    ("yaml-scalar-for-variants", ["--config", "{root}/scalar_variants.yaml"],
     r"scalar_variants.yaml: eval\.variants must be a list of strings \(YAML \[a, b, ...\], even for one\), got 'none'"),
    ("yaml-scalar-for-targets", ["--config", "{root}/scalar_targets.yaml"],
     r"max_position_embeddings must be a list of integers .*got 16384"),
    ("yaml-wrong-item-type", ["--config", "{root}/wrong_type.yaml"], r"perplexity_lengths must be a list of integers .*\['abc'\]"),
    ("yaml-bool-for-count", ["--config", "{root}/bool_count.yaml"], r"trials must be an integer, got True"),
    ("yaml-not-a-mapping", ["--config", "{root}/not_mapping.yaml"], r"must be a mapping of keys .*got \['variants', 'none'\]"),
    ("yaml-unknown-key", ["--config", "{root}/unknown_key.yaml"], r"section eval: unknown key\(s\) \['curve_lenght'\]; the keys are: .*curve_length"),
    ("yaml-missing", ["--config", "{root}/missing.yaml"], r"config file not found: .*missing.yaml"),
    ("no-targets", ["--config", "{root}/no_targets.yaml", "--output_dir", "{out}"], r"max_position_embeddings is empty"),
    ("no-variants", ["--config", "{root}/no_variants.yaml", "--output_dir", "{out}"], r"variants is empty: nothing to evaluate"),
    ("nothing-to-measure", [*EVAL, "--eval.variants", "none"], r"nothing to measure: set at least one of eval\.perplexity_lengths"),
    ("variant-twice", [*EVAL, "--eval.variants", "yarn", "yarn", "--eval.perplexity_lengths", "64"],
     r"variants lists a value twice: \['yarn', 'yarn'\]"),
    ("unknown-variant", [*EVAL, "--eval.variants", "yarnn", "--eval.perplexity_lengths", "64"], r"unknown method 'yarnn'"),
    ("unknown-variant-parameter", [*EVAL, "--eval.variants", "yarn betafast=3", "--eval.perplexity_lengths", "64"],
     r"unknown parameter\(s\) \['betafast'\] for method 'yarn'"),
    ("depth-past-one", [*EVAL, "--eval.passkey_lengths", "128", "--eval.depths", "2"], r"depths must be fractions in \[0, 1\], got \[2.0\]"),
    ("zero-trials", [*EVAL, "--eval.passkey_lengths", "128", "--eval.trials", "0"], r"trials must be >= 1, got 0"),
    ("zero-documents", [*EVAL, "--eval.perplexity_lengths", "64", "--eval.perplexity_documents", "0"],
     r"perplexity_documents must be >= 1, got 0"),
    ("stride-past-window", [*EVAL, "--eval.strided_windows", "64", "--eval.strided_stride", "100"],
     r"strided_stride must be 0 \(half the window\) or in 1..64"),
    ("window-zero", [*EVAL, "--eval.strided_windows", "0"], r"strided_windows must hold token counts >= 2, got \[0\]"),
    ("grid-without-length", [*EVAL, "--eval.grid", "yarn beta_fast=8|16"], r"grid needs eval\.tune_length"),
    ("empty-corpus", [*EVAL, "--data.corpus", "", "--eval.perplexity_lengths", "64"], r"corpus is empty"),
    ("missing-model", [*EVAL[:1], "/missing/path", *EVAL[2:], "--eval.perplexity_lengths", "64"],
     r"model '/missing/path': no such file or folder"),
    ("output-is-a-file", [*EVAL[:7], "{root}/afile", *EVAL[8:], "--eval.perplexity_lengths", "64"], r"output_dir .*afile is a file"),
    ("output-inside-the-model", [*EVAL[:7], "{root}/llama/eval", *EVAL[8:], "--eval.perplexity_lengths", "64"],
     r"output_dir .*llama/eval is or lies inside the input .*llama"),
    ("output-is-the-corpus", [*EVAL[:7], "{root}/corpus", *EVAL[8:], "--eval.perplexity_lengths", "64"],
     r"output_dir .*corpus is or lies inside the input .*corpus"),
    ("variant-not-applicable", [*EVAL, "--eval.variants", "none", "interpolate", "--eval.perplexity_lengths", "64"],
     r"method 'interpolate' applies to learned positions, but this llama model uses rope positions"),
    ("corrupt-results", [*EVAL[:7], "{root}/results", *EVAL[8:], "--eval.perplexity_lengths", "64"],
     r"results.json is not a results file of this recipe \(Expecting property name"),
    # after loading the model and tokenizer (still nothing written)
    ("missing-corpus", [*EVAL, "--data.corpus", "/missing/*.txt", "--eval.perplexity_lengths", "64"],
     r"no corpus files match '/missing/\*.txt'"),
    ("passkey-too-short", [*EVAL, "--eval.passkey_lengths", "5"],
     r"passkey_lengths \[5\]: length 5 is too short for the retrieval prompt"),
    ("documents-too-short", [*EVAL, "--eval.perplexity_lengths", "5000"], r"needs 2 documents of >= 5000 tokens, 0 have them"),
    ("bad-attention", [*EVAL, "--model.attn_implementation", "bogus", "--eval.perplexity_lengths", "64"], r"bogus"),
]
AFTER_LOADING = {"missing-corpus", "passkey-too-short", "documents-too-short"}


# refused after reading the text or the weights (their progress bars come first)
CLI_AFTER_READING = {"demo-long-tokens-past-text", "demo-long-tokens-too-short-for-passkey"}


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


@pytest.mark.parametrize("argv,pattern", [c[1:] for c in CLI_CASES], ids=[c[0] for c in CLI_CASES])
def test_cli_refuses_with_one_line_and_changes_nothing(argv, pattern, root, capsys):
    name = next(c[0] for c in CLI_CASES if c[1] is argv)
    check_refusal(cli.main, argv, pattern, root, capsys, alone=name not in CLI_AFTER_READING)


@pytest.mark.parametrize("argv,pattern", [c[1:] for c in EVAL_CASES], ids=[c[0] for c in EVAL_CASES])
def test_evaluate_refuses_with_one_line_and_changes_nothing(argv, pattern, root, capsys, monkeypatch):
    monkeypatch.setattr(recipe, "evaluate_variant", lambda *a, **k: pytest.fail("measured"))
    name = next(c[0] for c in EVAL_CASES if c[1] is argv)
    check_refusal(recipe.main, argv, pattern, root, capsys, alone=name not in AFTER_LOADING)


def test_patch_refuses_an_output_that_contains_the_current_folder(root, capsys, monkeypatch):
    monkeypatch.chdir(root / "sub")
    check_refusal(cli.main, [*PATCH, "--factor", "2", "--out", "..", "--overwrite"],
                  r"contains the input .*llama|is or contains the current folder", root, capsys)
    check_refusal(cli.main, [*PATCH, "--factor", "2", "--out", ".", "--overwrite"],
                  r"--out \. is or contains the current folder", root, capsys)


# -- real processes: what a shell sees -----------------------------------------------------------------

HF_POSENC = [sys.executable, "-m", "hf_posenc.cli"]  # the console script, without needing it on PATH
SUBPROCESS_CASES = [
    ("patch-missing-path", [*HF_POSENC, "patch", "/missing/path", "--method", "yarn", "--factor", "2", "--out", "{out}"],
     r"model '/missing/path': no such file or folder"),
    ("unknown-subcommand", [*HF_POSENC, "frobnicate"], r"invalid choice: 'frobnicate'"),
    ("demo-negative-tokens", [*HF_POSENC, *DEMO, "--tokens=-5"], r"tokens must be >= 2"),
    ("plot-lengths-abc", [*HF_POSENC, *PLOT, "--what", "attention", "--lengths", "abc"], r"--lengths must be"),
    ("evaluate-yaml-tab", [sys.executable, str(ROOT / "recipes" / "evaluate.py"), "--config", "{root}/tab.yaml"],
     r"tab.yaml is not valid YAML"),
    ("evaluate-zero-length", [sys.executable, str(ROOT / "recipes" / "evaluate.py"), *EVAL, "--eval.perplexity_lengths", "0"],
     r"perplexity_lengths must hold token counts >= 2"),
]


@pytest.mark.parametrize("argv,pattern", [c[1:] for c in SUBPROCESS_CASES], ids=[c[0] for c in SUBPROCESS_CASES])
def test_a_shell_sees_exit_code_2_and_one_error_line(argv, pattern, root):
    before = snapshot(root)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run(fill(argv, root), capture_output=True, text=True, env=env, timeout=300, cwd=root / "sub")
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    assert re.search(pattern, lines[0]) and proc.stdout == ""
    assert snapshot(root) == before


# -- patch --overwrite: the previous model's files do not survive, and a failed save changes nothing ----

def test_patch_overwrite_replaces_the_folder_whole(root, tmp_path, capsys):
    out = tmp_path / "patched"
    out.mkdir()
    for stale in ("pytorch_model.bin", "model.safetensors.index.json", "tokenizer.model", "model.safetensors"):
        (out / stale).write_text("from an older model")
    cli.main([*fill(PATCH, root), "--factor", "2", "--out", str(out), "--overwrite"])
    fresh = tmp_path / "fresh"
    cli.main([*fill(PATCH, root), "--factor", "2", "--out", str(fresh)])
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in fresh.iterdir())
    assert (out / "model.safetensors").read_bytes() == (fresh / "model.safetensors").read_bytes()
    assert json.loads((out / "config.json").read_text())["rope_parameters"]["rope_type"] == "yarn"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fresh", "patched"]  # no temporary folder left


def test_patch_that_fails_while_saving_leaves_the_output_as_it_was(root, tmp_path, capsys, monkeypatch):
    from transformers import PreTrainedModel

    out = tmp_path / "patched"
    out.mkdir()
    (out / "model.safetensors").write_text("the previous model")

    def full_disk(self, folder, **kwargs):
        (Path(folder) / "config.json").write_text("{")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(PreTrainedModel, "save_pretrained", full_disk)
    before = snapshot(tmp_path)
    code, lines = refused(cli.main, [*fill(PATCH, root), "--factor", "2", "--out", str(out), "--overwrite"], capsys)
    assert code == 2 and lines[-1] == "error: [Errno 28] No space left on device"
    after = snapshot(tmp_path)
    del before["."], after["."]  # (the folder's own mtime: a temporary folder came and went in it)
    assert after == before  # the old model untouched, no half-written folder beside it


def test_a_reader_that_leaves_ends_the_command_quietly():
    """`hf-posenc evaluate --help | head -3`: the pipe closes under the writer; that is no input error, so no
    'error: [Errno 32] Broken pipe' line (a subprocess: the handler points the process's stdout at /dev/null)."""
    import subprocess
    import sys

    code = ("from hf_posenc.user_input import refusals\n"
            "with refusals():\n    raise BrokenPipeError(32, 'Broken pipe')\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 1 and done.stderr == "", done.stderr
