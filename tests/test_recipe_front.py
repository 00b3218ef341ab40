"""What the recipes say to the person running them: the command `usage:` names, a refused empty config,
the plan printed before a run starts, where an evaluation's files went, an interrupted run's one line."""

from __future__ import annotations

import pytest

from hf_posenc import cli
from hf_posenc.errors import ConfigError
from hf_posenc.recipes import evaluate as eval_recipe
from hf_posenc.recipes import finetune_config
from test_eval_recipe import checkpoint, corpus_dir  # noqa: F401  (fixtures)


@pytest.mark.parametrize("argv, usage", [
    (["finetune", "--help"], "usage: hf-posenc finetune --config FILE.yaml"),
    (["evaluate", "--help"], "usage: hf-posenc evaluate [--config FILE.yaml]"),
])
def test_help_names_the_command_typed(capsys, argv, usage):
    with pytest.raises(SystemExit) as stop:
        cli.main(argv)
    assert stop.value.code == 0
    assert capsys.readouterr().out.startswith(usage + " ")


def test_help_of_the_modules_and_scripts_names_them(capsys, monkeypatch):
    from hf_posenc.recipes import config as rc

    module = rc.__file__.replace("config.py", "finetune.py")
    monkeypatch.setattr("sys.argv", [module, "--help"])
    assert rc.program("finetune") == "python -m hf_posenc.recipes.finetune"
    monkeypatch.setattr("sys.argv", ["recipes/evaluate.py"])
    assert rc.program("evaluate") == "recipes/evaluate.py"
    assert rc.program("evaluate", "hf-posenc evaluate") == "hf-posenc evaluate"


@pytest.mark.parametrize("text", ["", "# only a comment\n", "---\n"])
def test_an_empty_config_file_is_refused_by_both_recipes(tmp_path, text):
    path = tmp_path / "empty.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=r"config file .*empty\.yaml is empty: give its sections"):
        finetune_config.parse_config(["--config", str(path)])
    with pytest.raises(ConfigError, match="is empty"):
        eval_recipe.parse_args(["--config", str(path)])


def test_evaluate_says_where_its_files_went(checkpoint, corpus_dir, tmp_path, capsys):  # noqa: F811
    out = tmp_path / "ev"
    eval_recipe.main(["--model.name", str(checkpoint), "--model.dtype", "float32", "--data.corpus", str(corpus_dir),
                      "--output_dir", str(out), "--eval.variants", "none", "--eval.curve_length", "64",
                      "--eval.curve_bucket", "32"])
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last == f"wrote {out / 'results.json'} and {out / 'summary.md'}; figures in {out}/: perplexity_curve.png"
