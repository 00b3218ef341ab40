"""The `hf-posenc` command on a tiny local checkpoint."""

import json

import pytest
from transformers import AutoModelForCausalLM

from hf_posenc.cli import main
from refusals import one_line_refusal
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
