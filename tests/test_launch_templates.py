"""The accelerate launcher templates (recipes/accelerate/*.yaml): each is a config accelerate itself reads,
and every engine key in it is one `accelerate launch` takes (a misspelt key would be dropped silently).

FSDP itself is not run here: accelerate 1.15 enables FSDP only on GPU-like devices, and with `use_cpu` its
FSDP config silently becomes plain CPU data parallelism (accelerate/state.py picks MULTI_CPU first). torch's
FSDP2 `fully_shard` does train over gloo on CPU processes; the recipe under it needs a GPU machine."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

TEMPLATES = sorted((Path(__file__).parent.parent / "recipes" / "accelerate").glob("*.yaml"))
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
