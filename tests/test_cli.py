"""The `hf-posenc` command on a tiny local checkpoint, and a catalogue of bad inputs to it, as a hostile new user
would type them: each is refused with ONE line `error: ...` on stderr naming what is wrong, exit code 2, no
traceback, and nothing on disk written, deleted or changed (names, sizes and mtimes of every file and folder,
before and after). A few run as real subprocesses, to show what a shell sees."""

import json
import sys
from pathlib import Path

import pytest
from transformers import AutoModelForCausalLM

from hf_posenc import cli
from hf_posenc.cli import main
from refusals import (GGUF_PATCH, cache, check_refusal, fill, gguf_refusal, ggufs,  # noqa: F401 (fixtures)
                      one_line_refusal, refused, root, shell_refusal, snapshot)
from tiny import tiny_model, token_ids


@pytest.fixture
def checkpoint(tmp_path):
    path = tmp_path / "tiny"
    tiny_model().save_pretrained(path)
    return path


def test_methods_lists_every_method_with_defaults(capsys):
    main(["methods", "--json"])
    methods = {m["name"]: m for m in json.loads(capsys.readouterr().out)}
    assert {"base", "ntk", "linear", "dynamic", "yarn", "dynamic_yarn", "llama3", "longrope"} <= set(methods)
    assert methods["yarn"]["parameters"]["beta_fast"] == 32.0 and methods["yarn"]["mechanisms"] == ["rope"]


def test_inspect(checkpoint, capsys):
    main(["inspect", str(checkpoint)])
    info = json.loads(capsys.readouterr().out)
    assert (info["model_type"], info["mechanism"], info["max_position_embeddings"]) == ("llama", "rope", 64)


def test_patch_saves_a_stock_loadable_checkpoint(checkpoint, tmp_path, capsys):
    out = tmp_path / "patched"
    main(["patch", str(checkpoint), "--method", "yarn", "--max-position-embeddings", "256",
          "--param", "beta_fast=16", "--out", str(out)])
    assert "saved to" in capsys.readouterr().out
    model = AutoModelForCausalLM.from_pretrained(out)
    assert model.config.rope_parameters["beta_fast"] == 16 and model.config.max_position_embeddings == 256
    assert model(token_ids(200)).logits.shape == (1, 200, 128)


@pytest.mark.parametrize("method,stock", [("yarn", True), ("dynamic", False)])
def test_patch_writes_the_tokenizer_context_and_a_card(checkpoint, tmp_path, capsys, method, stock):
    from transformers import AutoTokenizer

    from tiny import tiny_tokenizer

    tokenizer = tiny_tokenizer()
    tokenizer.model_max_length = 64
    tokenizer.save_pretrained(checkpoint)
    out = tmp_path / "patched"
    main(["patch", str(checkpoint), "--method", method, "--factor", "4", "--out", str(out)])
    assert AutoTokenizer.from_pretrained(out).model_max_length == 256  # what tools truncate to
    assert AutoTokenizer.from_pretrained(checkpoint).model_max_length == 64  # the input is left as it was
    card = (out / "README.md").read_text()
    assert f"with `{method}` positions" in card and "64 -> 256 tokens" in card
    assert ("AutoModelForCausalLM.from_pretrained(folder)" in card) == stock
    assert ("--hf-overrides" in card) == stock  # dynamic: no engine computes it as hf_posenc does


def refusal(capsys, argv) -> str:
    """The one-line refusal (exit code 2) of `hf-posenc argv`."""
    return one_line_refusal(capsys, main, argv, alone=True)


def test_patch_refuses_before_loading(checkpoint, tmp_path, capsys):
    out = str(tmp_path / "x")
    assert "factor must be > 0" in refusal(capsys, ["patch", str(checkpoint), "--method", "linear", "--factor", "-1",
                                                    "--out", out])
    assert "unknown method 'yarnn'" in refusal(capsys, ["patch", str(checkpoint), "--method", "yarnn", "--factor", "2",
                                                        "--out", out])
    assert not (tmp_path / "x").exists()
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "notes.txt").write_text("mine")
    assert "exists and is not empty; pass --overwrite" in refusal(
        capsys, ["patch", str(checkpoint), "--method", "linear", "--factor", "2", "--out", str(tmp_path / "full")])


def test_auto_dtype_follows_the_hardware(monkeypatch):
    """bfloat16 only where the CPU runs it natively (torch.cpu's AVX512-BF16 / AMX probes), else float32."""
    import torch

    from hf_posenc import InvalidParameterError, loading

    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX512")   # the same on an AVX2 machine
    for amx, avx512_bf16, expected in [(False, False, torch.float32), (False, True, torch.bfloat16),
                                       (True, False, torch.bfloat16)]:
        monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda v=amx: v, raising=False)
        monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda v=avx512_bf16: v, raising=False)
        dtype, why = loading.resolve_dtype("auto", "cpu")
        assert dtype == expected
        assert ("natively" in why) == (expected == torch.bfloat16) and "capability" in why
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX2")   # the kernels held below AVX512
    assert loading.resolve_dtype("auto", "cpu")[0] == torch.float32
    assert loading.resolve_dtype("float32", "cpu") == (torch.float32, "asked for")
    with pytest.raises(InvalidParameterError, match="dtype must be one of auto"):
        loading.resolve_dtype("float8")


def test_recipes_run_from_the_package_and_take_shipped_configs_by_name(capsys, tmp_path):
    """`hf-posenc finetune|evaluate` and `python -m hf_posenc.recipes.*` run the recipes of recipes/*.py (one
    code path) from an installed package; --config takes a shipped config's name."""
    import subprocess
    import sys

    from hf_posenc import recipes
    from hf_posenc.recipes.finetune_config import parse_config

    assert "smollm2_yarn_16k_finetune" in recipes.shipped_configs() and "eval_smollm2_cpu" in recipes.shipped_configs()
    assert recipes.config_path("smollm2_yarn_16k_finetune") == recipes.CONFIGS / "smollm2_yarn_16k_finetune.yaml"
    assert recipes.config_path("nonesuch") is None and recipes.config_path("../configs/x") is None
    cfg = parse_config(["--config", "smollm2_yarn_16k_finetune", "--output_dir", str(tmp_path / "o")])
    assert cfg.posenc["method"] == "yarn"
    for name in ("finetune", "evaluate"):
        with pytest.raises(SystemExit) as done:
            main([name, "--help"])
        assert done.value.code == 0 and "--config" in capsys.readouterr().out
    with pytest.raises(SystemExit) as refused:
        main(["finetune", "--config", "nonesuch"])
    err = capsys.readouterr().err.strip().splitlines()
    assert refused.value.code == 2 and len(err) == 1 and "nor a shipped config: " in err[0]
    with pytest.raises(SystemExit) as refused:
        main(["evaluate", "--config", "nonesuch"])
    assert refused.value.code == 2 and "eval_smollm2_cpu" in capsys.readouterr().err
    module = subprocess.run([sys.executable, "-m", "hf_posenc.recipes.finetune", "--help"], capture_output=True,
                            text=True, timeout=120)
    assert module.returncode == 0 and "Fields (defaults)" in module.stdout


def test_help_names_every_verb_in_its_first_line(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    verbs = out.split("{", 1)[1].split("}", 1)[0].split(",")
    first = out.split("\n\n")[1].split(".")[0]   # the description's first sentence
    assert len(verbs) == 10 and all(verb in first for verb in verbs), (verbs, first)


# -- bad input as a hostile new user would type it: one `error:` line, exit code 2, nothing on disk changed ---------

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
    ("patch-already-patched", ["patch", "{root}/patched", "--method", "ntk", "--factor", "2", "--out", "{out}"],
     r"patched is already patched \(method 'yarn'\); a patch does not go on top of another: patch the model it "
     r"was patched from"),   # was the API's advice, hp.unpatch(model)
    # the table plots write a file each as they go: the patches refused before the first one
    ("plot-table-rope-method-on-a-table", ["plot", "{root}/gpt2", "--what", "table", "--method", "yarn", "--out",
                                           "{out}"], r"method 'yarn' applies to rope positions"),
    ("plot-similarity-target-below-the-table", ["plot", "{root}/gpt2", "--what", "table,similarity", "--variants",
                                                "model,tile", "--max-position-embeddings", "16", "--out", "{out}"],
     r"max_position_embeddings=16 .*64"),
    ("plot-unknown-variant", ["plot", "{root}/gpt2", "--variants", "bogus", "--out", "{out}"],
     r"--variants: unknown similarity variant\(s\) \['bogus'\]; known: model, sinusoidal"),
    ("plot-attention-past-memory", [*PLOT, "--what", "attention", "--lengths", "64,3000000"],
     r"3000000 tokens: eager attention holds 4 heads x 3000000 x 3000000 weights per layer \(~\d+\.\d GiB\)"),
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
    ("demo-out-is-the-input", [*DEMO[:-1], "{root}/llama"], r"--out .*llama is or lies inside the input .*llama"),
    ("export-the-embedded-gguf", ["export", "smollm2", "--out", "{root}/s.gguf"],
     r"smollm2 is a GGUF file already: add a patch to it with hf-posenc patch smollm2 --method M --out X\.gguf"),
    ("demo-missing-corpus", ["demo", "--model", "{root}/llama", "--corpus", "/missing/*.txt", "--tokens", "32"],
     r"no corpus files match '/missing/\*.txt'"),
]


# refused after reading the text or the weights (their progress bars come first)
CLI_AFTER_READING = {"demo-long-tokens-past-text", "demo-long-tokens-too-short-for-passkey", "plot-attention-past-memory"}


@pytest.mark.parametrize("argv,pattern", [c[1:] for c in CLI_CASES], ids=[c[0] for c in CLI_CASES])
def test_cli_refuses_with_one_line_and_changes_nothing(argv, pattern, root, capsys):
    name = next(c[0] for c in CLI_CASES if c[1] is argv)
    check_refusal(cli.main, argv, pattern, root, capsys, alone=name not in CLI_AFTER_READING)


def test_patch_refuses_an_output_that_contains_the_current_folder(root, capsys, monkeypatch):
    monkeypatch.chdir(root / "sub")
    check_refusal(cli.main, [*PATCH, "--factor", "2", "--out", "..", "--overwrite"],
                  r"contains the input .*llama|is or contains the current folder", root, capsys)
    check_refusal(cli.main, [*PATCH, "--factor", "2", "--out", ".", "--overwrite"],
                  r"--out \. is or contains the current folder", root, capsys)


@pytest.mark.parametrize("command", ["patch", "plot"])
def test_ctrl_c_says_what_was_kept_in_one_line(root, capsys, monkeypatch, command):
    """Ctrl-C while the weights load printed a KeyboardInterrupt traceback (patch, export, demo, plot)."""
    from hf_posenc import api, loading

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(loading, "load_model", interrupted)
    monkeypatch.setattr(api, "from_pretrained", interrupted)
    argv = [*PATCH, "--factor", "2", "--out", "{out}"] if command == "patch" else PLOT
    before = snapshot(root)
    with pytest.raises(SystemExit) as stop:
        cli.main(fill(argv, root))
    lines = capsys.readouterr().err.strip().splitlines()
    assert stop.value.code == 130 and lines == [f"interrupted: {cli.INTERRUPTED[command]}"], lines
    assert snapshot(root) == before and not (root / "out").exists()


# -- real processes: what a shell sees -----------------------------------------------------------------

HF_POSENC = [sys.executable, "-m", "hf_posenc.cli"]  # the console script, without needing it on PATH
SUBPROCESS_CASES = [
    ("patch-missing-path", [*HF_POSENC, "patch", "/missing/path", "--method", "yarn", "--factor", "2", "--out", "{out}"],
     r"model '/missing/path': no such file or folder"),
    ("unknown-subcommand", [*HF_POSENC, "frobnicate"], r"invalid choice: 'frobnicate'"),
    ("demo-negative-tokens", [*HF_POSENC, *DEMO, "--tokens=-5"], r"tokens must be >= 2"),
    ("plot-lengths-abc", [*HF_POSENC, *PLOT, "--what", "attention", "--lengths", "abc"], r"--lengths must be"),
]


@pytest.mark.parametrize("argv,pattern", [c[1:] for c in SUBPROCESS_CASES], ids=[c[0] for c in SUBPROCESS_CASES])
def test_a_shell_sees_exit_code_2_and_one_error_line(argv, pattern, root):
    shell_refusal(argv, pattern, root)


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


# -- patch X.gguf --out Y.gguf: the command's own checks, refused before any weight is read ---------------------

# (id, argv, the error line, refused before the weights load)
GGUF_CASES = [
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
]


@pytest.mark.parametrize("argv,pattern,early", [c[1:] for c in GGUF_CASES], ids=[c[0] for c in GGUF_CASES])
def test_gguf_refusals_are_one_line_and_the_header_decides_first(argv, pattern, early, ggufs, cache, capsys,
                                                                 monkeypatch):
    gguf_refusal(argv, pattern, early, ggufs, cache, capsys, monkeypatch)
