"""What the recipes say to the person running them: the command `usage:` names, a refused empty config,
the plan printed before a run starts, where an evaluation's files went, an interrupted run's one line."""

from __future__ import annotations

import re

import pytest

from hf_posenc import cli
from hf_posenc.errors import ConfigError
from hf_posenc.recipes import evaluate as eval_recipe
from hf_posenc.recipes import evaluate_config
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
    from hf_posenc.recipes import recipe_config as rc

    module = rc.__file__.replace("recipe_config.py", "finetune.py")
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
        evaluate_config.parse_args(["--config", str(path)])


def test_evaluate_says_where_its_files_went(checkpoint, corpus_dir, tmp_path, capsys):  # noqa: F811
    out = tmp_path / "ev"
    eval_recipe.main(["--model.name", str(checkpoint), "--model.dtype", "float32", "--data.corpus", str(corpus_dir),
                      "--output_dir", str(out), "--eval.variants", "none", "--eval.curve_length", "64",
                      "--eval.curve_bucket", "32"])
    said = capsys.readouterr()
    last = said.out.strip().splitlines()[-1]
    assert last == f"wrote {out / 'results.json'} and {out / 'summary.md'}; figures in {out}/: perplexity_curve.png"
    # before the work: what it is and about how long it takes here
    assert re.search(r"^to do: 1 evaluation\(s\) x 1 forward passes of up to 64 tokens; roughly \d+ s here "
                     r"\(from timed passes of 64 and 64 tokens\)$", said.err, re.M), said.err


def test_evaluate_ctrl_c_says_what_was_saved_and_how_to_continue(checkpoint, corpus_dir, tmp_path, capsys,  # noqa: F811
                                                                monkeypatch):
    argv = ["--model.name", str(checkpoint), "--model.dtype", "float32", "--data.corpus", str(corpus_dir),
            "--output_dir", str(tmp_path), "--eval.variants", "none", "yarn", "--eval.max_position_embeddings", "128",
            "--eval.curve_length", "64", "--eval.curve_bucket", "32", "--plots", "false"]
    real, calls = eval_recipe.evaluate_variant, []

    def second_interrupted(*a, **kw):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(*a, **kw)

    monkeypatch.setattr(eval_recipe, "evaluate_variant", second_interrupted)
    with pytest.raises(SystemExit) as stop:
        eval_recipe.main(argv)
    assert stop.value.code == 130
    err = capsys.readouterr().err
    assert err.strip().splitlines()[-1] == (f"interrupted: {tmp_path / 'results.json'} holds 1 finished "
                                            f"evaluation(s) (none); run the same command again to do the rest "
                                            f"(resume: true skips what is saved)")
    assert "Traceback" not in err
    monkeypatch.setattr(eval_recipe, "evaluate_variant", real)
    assert set(eval_recipe.main(argv)["variants"]) == {"none", "yarn"}
    assert "none: done already (results.json), skipped" in capsys.readouterr().err


def test_evaluate_passes_are_counted_per_measure():
    args = evaluate_config.parse_args(["--eval.variants", "none", "--eval.perplexity_lengths", "100", "200",
                                   "--eval.perplexity_documents", "2", "--eval.strided_windows", "100",
                                   "--eval.strided_tokens", "300", "--eval.passkey_lengths", "50", "80",
                                   "--eval.depths", "0.5", "--eval.trials", "2"])
    inputs = {"lengths": [[0] * 200] * 2, "curve": [], "strided": [0] * 300, "trials": {"passkey": [None] * 4}}
    assert eval_recipe.passes(args, inputs) == [200, 200, 100, 100, 100, 100, 100, 50, 50, 80, 80]


# -------------------------------------------------------------------------------- the fine-tune recipe
from test_finetune import _recipe, run_recipe, text_file, tiny_dir, write_config  # noqa: E402,F401  (fixtures)

from hf_posenc.train import checkpoints as ckpt  # noqa: E402


def test_finetune_says_what_it_is_about_to_do_and_how_long_it_takes(tmp_path, tiny_dir, text_file, capsys):  # noqa: F811
    cfg = write_config(tmp_path / "c.yaml", tiny_dir, data={"corpus": str(text_file)})
    run_recipe(cfg)
    out = capsys.readouterr().out
    assert (f"fine-tune {tiny_dir}: posenc yarn max_position_embeddings=256 (128 -> 256 positions), objective lm, "
            f"all weights\n  6 steps x 4 sequences of 64 tokens (batch_size 2 x grad_accum 2 x 1 process) = up to 256 "
            f"tokens a step, 1,536 in all\n  output: {tmp_path / 'out'}; checkpoints every 2 steps\n") in out
    assert out.index("fine-tune ") < out.index("trainable parameters")      # before the model loads
    assert "step 1 took " in out and "the 5 steps left take about " in out


def test_ctrl_c_says_what_was_saved_and_how_to_resume(tmp_path, tiny_dir, text_file, capsys, monkeypatch):  # noqa: F811
    """Ctrl-C during step 5 (checkpoints at 2 and 4): one line, exit code 130, no traceback; --resume goes on."""
    cfg = write_config(tmp_path / "c.yaml", tiny_dir, data={"corpus": str(text_file)})
    write = ckpt.LossLog.write

    def interrupted(self, record):
        if record["step"] == 5:
            raise KeyboardInterrupt
        write(self, record)

    monkeypatch.setattr(ckpt.LossLog, "write", interrupted)
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    capsys.readouterr()
    assert _recipe().cli(["--config", str(cfg)]) == 130
    err = capsys.readouterr().err
    out = tmp_path / "out"
    assert err.strip().splitlines()[-1] == (f"interrupted after step 4 of 6: the last checkpoint is step 4 "
                                            f"({ckpt.checkpoint_dir(out, 4)}); continue with the same command and "
                                            f"--resume")
    assert "Traceback" not in err
    monkeypatch.setattr(ckpt.LossLog, "write", write)
    run_recipe(cfg, "--resume")
    assert [r["step"] for r in ckpt.read_log(out)] == list(range(1, 7))


def test_a_half_written_checkpoint_is_named_when_resuming(tmp_path, tiny_dir, text_file, capsys):  # noqa: F811
    import shutil

    cfg = write_config(tmp_path / "c.yaml", tiny_dir, data={"corpus": str(text_file)}, train={"steps": 8})
    run_recipe(cfg, "--train.stop_after_steps", "5")       # checkpoints at 2 and 4
    out = tmp_path / "out"
    half = ckpt.checkpoint_dir(out, 6)                      # a save of step 6 cut short: no `done` mark
    shutil.copytree(ckpt.checkpoint_dir(out, 4), half)
    (half / "done").unlink()
    capsys.readouterr()
    run_recipe(cfg, "--resume")
    said = capsys.readouterr().out
    assert "step 6 incomplete (the run stopped while saving it), resuming from step 4" in said
    assert "the 4 steps left take about " in said          # the pace of the logged steps
    assert [r["step"] for r in ckpt.read_log(out)] == list(range(1, 9))


@pytest.mark.parametrize("family, chosen", [("gemma2", "eager"), ("llama", "sdpa")])
def test_auto_attention_loads_what_the_models_class_runs(tmp_path, family, chosen):
    """The search and evaluate recipes resolve "auto" by the model's class (Gemma 2 has no sdpa: transformers refuses
    it at load), before the evaluation's config is saved; a given implementation stays."""
    from hf_posenc.recipes import search as search_recipe
    from hf_posenc.recipes import search_config
    from transformers import AutoModelForCausalLM

    from tiny import ROPE_FAMILIES, tiny_config

    overrides = {k: v for k, v in ROPE_FAMILIES[family].items() if k != "attn_implementation"}
    AutoModelForCausalLM.from_config(tiny_config(family, **overrides)).save_pretrained(tmp_path / "m")
    (tmp_path / "text.txt").write_text("words " * 200)
    common = ["--model.name", str(tmp_path / "m"), "--data.corpus", str(tmp_path / "text.txt")]
    evaluation = eval_recipe.EvaluateRecipe(evaluate_config.parse_args(
        [*common, "--output_dir", str(tmp_path / "e"), "--eval.variants", "none", "--eval.perplexity_lengths", "32"]))
    assert evaluation.config["model"]["attn_implementation"] == chosen
    small = ["--search.target", "256", "--search.guard_length", "16", "--search.passages", "4",
             "--search.passage_tokens", "8", "--search.far_from", "32"]
    search = search_recipe.SearchRecipe(search_config.parse_args([*common, "--output_dir", str(tmp_path / "s"),
                                                                  *small]))
    assert search.args.model.attn_implementation == chosen
    given = search_config.parse_args([*common, "--output_dir", str(tmp_path / "g"), *small,
                                      "--model.attn_implementation", "eager"])
    assert search_recipe.SearchRecipe(given).args.model.attn_implementation == "eager"
