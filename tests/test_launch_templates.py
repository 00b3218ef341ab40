"""The accelerate launcher templates (recipes/accelerate/*.yaml): each is a config accelerate itself reads,
and every engine key in it is one `accelerate launch` takes (a misspelt key would be dropped silently).

FSDP and DeepSpeed on a CPU-only machine: accelerate 1.15 turns either engine on only for
GPU-like devices; on CPU processes (state.py picks MULTI_CPU first) fsdp.yaml would silently be plain data
parallelism, each process holding the whole model. The recipe refuses that in one line naming ddp.yaml (what
runs on CPUs); launched in two processes here, nothing is written. Sharding itself needs a GPU machine."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from hf_posenc.errors import ConfigError
from hf_posenc.recipes.finetune_checks import check_engine
from tiny import free_port

ROOT = Path(__file__).resolve().parent.parent
TEMPLATES = sorted((ROOT / "recipes" / "accelerate").glob("*.yaml"))
ENGINE_SECTIONS = ("fsdp_config", "deepspeed_config")


def launch_options() -> set[str]:
    from accelerate.commands.launch import launch_command_parser

    return {o.lstrip("-") for action in launch_command_parser()._actions for o in action.option_strings}


@pytest.mark.parametrize("path", TEMPLATES, ids=lambda p: p.name)
def test_template_is_an_accelerate_config_whose_keys_launch_takes(path):
    from accelerate.commands.config.config_args import load_config_from_file

    config = load_config_from_file(str(path))  # accelerate's own schema: unknown top-level keys fail here
    raw = yaml.safe_load(path.read_text())
    assert config.distributed_type.value.lower().replace("_", "") in {
        "single.yaml": {"no"}, "ddp.yaml": {"multigpu"}, "fsdp.yaml": {"fsdp"},
        "deepspeed_zero3.yaml": {"deepspeed"}}[path.name]
    options = launch_options()
    for section in ENGINE_SECTIONS:
        unknown = sorted(k for k in raw.get(section) or {} if k not in options)
        assert not unknown, f"{path.name}: {section} keys accelerate launch does not take: {unknown}"


def test_a_misspelt_key_is_caught(tmp_path):
    bad = tmp_path / "fsdp.yaml"
    raw = yaml.safe_load(TEMPLATES[[p.name for p in TEMPLATES].index("fsdp.yaml")].read_text())
    raw["fsdp_config"]["fsdp_reshard_after_forwad"] = True
    bad.write_text(yaml.safe_dump(raw))
    with pytest.raises(AssertionError, match="fsdp_reshard_after_forwad"):
        test_template_is_an_accelerate_config_whose_keys_launch_takes(bad)


def test_templates_cover_the_engines_the_readme_names():
    assert {p.name for p in TEMPLATES} == {"single.yaml", "ddp.yaml", "fsdp.yaml", "deepspeed_zero3.yaml"}


@pytest.mark.parametrize("variable,engine", [("ACCELERATE_USE_FSDP", "FSDP"), ("ACCELERATE_USE_DEEPSPEED", "DeepSpeed")])
def test_a_sharding_engine_on_cpu_processes_is_refused_naming_ddp(monkeypatch, variable, engine):
    monkeypatch.setenv(variable, "true")
    with pytest.raises(ConfigError, match=rf"asks for {engine} .* runs only on GPUs.*recipes/accelerate/ddp.yaml"):
        check_engine(cpu=True)
    check_engine(cpu=False)   # on a GPU machine accelerate runs it
    monkeypatch.setenv(variable, "false")
    check_engine(cpu=True)    # ddp.yaml, single.yaml, torchrun: nothing asked


@pytest.mark.skipif(torch.accelerator.current_accelerator() is not None, reason="a CPU-only machine's refusal")
def test_fsdp_template_in_two_cpu_processes_is_refused_before_anything_is_written(tmp_path):
    from tiny import tiny_model, tiny_tokenizer

    model_dir, out = tmp_path / "tiny", tmp_path / "out"
    tiny_model("llama", max_position_embeddings=128).save_pretrained(model_dir)
    tiny_tokenizer().save_pretrained(model_dir)
    (tmp_path / "text.txt").write_text("To be, or not to be, that is the question. " * 200)
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump({
        "model": {"name": str(model_dir), "dtype": "float32"},
        "posenc": {"method": "yarn", "max_position_embeddings": 256},
        "data": {"corpus": str(tmp_path / "text.txt"), "seq_len": 64, "cache_dir": str(tmp_path / "cache")},
        "train": {"steps": 2, "batch_size": 1, "grad_accum": 1, "warmup_steps": 0, "save_every": 2},
        "output_dir": str(out)}))
    template = [p for p in TEMPLATES if p.name == "fsdp.yaml"][0]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error"}
    proc = subprocess.run([sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(template),
                           "--num_processes", "2", "--main_process_port", str(free_port()),
                           str(ROOT / "recipes" / "finetune.py"), "--config", str(config)],
                          env=env, capture_output=True, text=True, timeout=300)
    refusals = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert proc.returncode != 0 and refusals, proc.stderr[-3000:]   # (the launcher adds its ChildFailedError)
    assert all("asks for FSDP" in line and "ddp.yaml" in line for line in refusals), refusals
    assert not out.exists()
