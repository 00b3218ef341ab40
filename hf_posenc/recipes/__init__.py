"""The recipes as importable modules, with their shipped configs and launcher templates, so they run the
same from an installed package as from a clone:

    hf-posenc finetune --config smollm2_yarn_16k_finetune        # one process; a shipped config by name
    accelerate launch -m hf_posenc.recipes.finetune --config smollm2_yarn_16k_finetune
    accelerate launch recipes/finetune.py --config recipes/configs/smollm2_yarn_16k_finetune.yaml   # a clone
    hf-posenc evaluate --config eval_smollm2_cpu                 # or python -m hf_posenc.recipes.evaluate

Both read their config through one system (config.py): a YAML file of sections, `--section.field` flags
over it, `--help` listing every field.
"""

from __future__ import annotations

from pathlib import Path

CONFIGS = Path(__file__).parent / "configs"  # the shipped recipe configs
LAUNCHERS = Path(__file__).parent / "accelerate"  # accelerate launcher templates (ddp, fsdp, deepspeed)


def shipped_configs() -> list[str]:
    return sorted(p.stem for p in CONFIGS.glob("*.yaml"))


def config_path(value: str) -> Path | None:
    """A --config value: a file, or the name of a shipped config ("smollm2_yarn_16k_finetune", with or
    without .yaml). None when it is neither."""
    path = Path(value).expanduser()
    if path.is_file():
        return path
    shipped = CONFIGS / (value if value.endswith(".yaml") else f"{value}.yaml")
    return shipped if "/" not in value and shipped.is_file() else None
