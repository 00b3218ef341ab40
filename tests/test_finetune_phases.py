"""The fine-tune recipe's phases, each called alone on a tiny Llama (hf_posenc/recipes/finetune_recipe.py):
the checks in the constructor, setup's parts, one train step, resume from a checkpoint the phases saved,
evaluate, the final save. The whole run through the command line: tests/test_finetune.py."""

from __future__ import annotations

import json

import pytest
import torch

import hf_posenc as hp
from hf_posenc.train import checkpoints as ckpt
from hf_posenc.errors import ConfigError
from hf_posenc.recipes import finetune_checks as checks
from hf_posenc.recipes.finetune_config import FinetuneConfig, parse_config
from hf_posenc.recipes.finetune_recipe import FinetuneRecipe
from test_finetune import text_file, tiny_dir, write_config  # noqa: F401  (fixtures)
from tiny import state

pytestmark = pytest.mark.usefixtures("one_thread")


def fresh_accelerate():
    """Each recipe builds its own Accelerator: the singleton state of the one before is dropped."""
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()


def recipe_for(tmp_path, tiny_dir, text_file, *flags, **sections):  # noqa: F811
    fresh_accelerate()
    path = write_config(tmp_path / "c.yaml", tiny_dir, data={"corpus": str(text_file)}, **sections)
    return FinetuneRecipe(parse_config(["--config", str(path), *flags]))


def test_the_constructor_checks_the_config_and_writes_nothing(tmp_path, tiny_dir, text_file):  # noqa: F811
    with pytest.raises(ConfigError, match="data.seq_len=512 is longer than the patched context"):
        recipe_for(tmp_path, tiny_dir, text_file, "--data.seq_len", "512")
    assert not (tmp_path / "out").exists()
    recipe = recipe_for(tmp_path, tiny_dir, text_file)
    assert (recipe.preflight.original_context, recipe.preflight.target_context, recipe.preflight.seq_len) == (128, 256, 64)
    assert recipe.progress == {"output_dir": str(tmp_path / "out"), "steps": 6, "step": None, "bar": None, "main": True}
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("cfg", [None, {}, "recipes/configs/smollm2_yarn_16k_finetune.yaml"])
def test_finetune_recipe_refuses_what_is_not_a_config(cfg):
    from hf_posenc.errors import ParameterTypeError
    from hf_posenc.recipes.finetune_recipe import FinetuneRecipe

    with pytest.raises(ParameterTypeError, match="FinetuneRecipe needs a FinetuneConfig"):
        FinetuneRecipe(cfg)


def test_setup_data_packs_the_corpus_and_writes_the_run_config_before_any_weights_load(tmp_path, tiny_dir,  # noqa: F811
                                                                                       text_file, capsys):  # noqa: F811
    recipe = recipe_for(tmp_path, tiny_dir, text_file)
    recipe.setup_accelerator()
    assert capsys.readouterr().out.startswith(f"fine-tune {tiny_dir}: posenc yarn")
    recipe.setup_data()
    assert len(recipe.dataset) == 24 and all(len(row["input_ids"]) == 64 for row in recipe.dataset)   # text_file's 24 blocks
    assert len(recipe.dataloader) == 12                                                           # batch_size 2
    out = tmp_path / "out"
    assert sorted(p.name for p in out.iterdir()) == ["finetune_config.json"]
    assert json.loads((out / "finetune_config.json").read_text()) == recipe.cfg.to_dict()
    assert not hasattr(recipe, "model")


def test_setup_model_patches_and_chooses_what_trains(tmp_path, tiny_dir, text_file, capsys):  # noqa: F811
    recipe = recipe_for(tmp_path, tiny_dir, text_file, "--train.trainable", "norms")
    recipe.setup_accelerator()
    recipe.setup_data()
    recipe.setup_model()
    described = hp.describe(recipe.model)
    assert described["method"] == "yarn" and described["max_position_embeddings"] == 256
    trained = [n for n, p in recipe.model.named_parameters() if p.requires_grad]
    assert trained and all("norm" in n for n in trained)
    assert recipe.objective.model is recipe.model and recipe.teacher is None
    assert "trainable parameters: " in capsys.readouterr().out


def test_train_steps_alone_update_the_weights_and_log_each_step(tmp_path, tiny_dir, text_file):  # noqa: F811
    recipe = recipe_for(tmp_path, tiny_dir, text_file)
    recipe.setup()
    assert recipe.resume() == 0
    before = state(recipe.model)
    assert not recipe.model.training   # loaded in eval mode: a step taken by hand must switch it
    record = recipe.train_step(1)   # the warmup starts at lr 0: step 1 moves nothing
    assert recipe.objective.training and recipe.model.training   # dropout, S2-Attn: on as in train()
    assert record["step"] == 1 and record["tokens"] == 2 * 2 * 64 and torch.isfinite(torch.tensor(record["loss"]))
    assert record["lr"] == pytest.approx(1e-3 / 2)   # the lr after the step: linear warmup over 2 steps
    assert all(torch.equal(before[k], v) for k, v in state(recipe.model).items())
    recipe.train_step(2)
    assert any(not torch.equal(before[k], v) for k, v in state(recipe.model).items())
    assert [r["step"] for r in ckpt.read_log(tmp_path / "out")] == [1, 2]


def test_save_checkpoint_then_resume_in_a_new_recipe_gives_the_same_next_step(tmp_path, tiny_dir, text_file):  # noqa: F811
    """Phases alone, bit for bit: steps 1-2, save_checkpoint(2), step 3; a fresh recipe resumed from the
    checkpoint takes step 3 to the same loss and the same weights."""
    first = recipe_for(tmp_path, tiny_dir, text_file)
    first.setup()
    first.resume()
    first.train_step(1)
    first.train_step(2)
    first.save_checkpoint(2)
    assert ckpt.latest_checkpoint(tmp_path / "out") == (ckpt.checkpoint_dir(tmp_path / "out", 2), 2)
    expected = first.train_step(3)
    expected_weights = state(first.model)

    again = recipe_for(tmp_path, tiny_dir, text_file, "--resume")
    again.setup()
    assert again.resume() == 2
    step3 = again.train_step(3)
    assert step3["loss"] == expected["loss"] and step3["lr"] == expected["lr"]
    for k, v in state(again.model).items():
        assert torch.equal(v, expected_weights[k]), k


def test_train_goes_on_from_the_steps_taken_alone_and_ends_as_a_straight_run(tmp_path, tiny_dir, text_file):  # noqa: F811
    straight = recipe_for(tmp_path / "a", tiny_dir, text_file, "--output_dir", str(tmp_path / "a" / "out"))
    straight.setup()
    expected = state(straight.train())

    by_hand = recipe_for(tmp_path / "b", tiny_dir, text_file, "--output_dir", str(tmp_path / "b" / "out"))
    by_hand.setup()
    by_hand.resume()
    by_hand.train_step(1)
    by_hand.save_checkpoint(1)   # off the save_every schedule: changes nothing in what trains
    final = by_hand.train()
    assert [r["step"] for r in ckpt.read_log(tmp_path / "b" / "out")] == list(range(1, 7))
    assert ([r["loss"] for r in ckpt.read_log(tmp_path / "b" / "out")]
            == [r["loss"] for r in ckpt.read_log(tmp_path / "a" / "out")])
    for k, v in state(final).items():
        assert torch.equal(v, expected[k]), k


def test_evaluate_and_save_final_alone(tmp_path, tiny_dir, text_file):  # noqa: F811
    recipe = recipe_for(tmp_path, tiny_dir, text_file, "--eval.lengths", "32", "--eval.documents", "1")
    recipe.setup()
    assert set(recipe.before) == {"perplexity@32"}
    assert recipe.evaluate() == recipe.before          # nothing trained since
    recipe.resume()
    recipe.train_step(1)
    final = recipe.save_final()
    out = tmp_path / "out"
    assert json.loads((out / "eval_before.json").read_text()) == recipe.before
    assert set(json.loads((out / "eval_after.json").read_text())) == {"perplexity@32"}
    ids = torch.arange(200)[None] % 250
    with torch.no_grad():
        torch.testing.assert_close(hp.from_pretrained(out).eval()(ids).logits, final.eval()(ids).logits,
                                   rtol=0, atol=1e-5)
    card = (out / "README.md").read_text()
    assert "yarn" in card and "1 optimizer step, 256 training tokens" in card   # the steps taken, not train.steps


def test_the_former_recipe_names_are_gone():
    """0.1.0 was never released: the names the recipe side had before its renames answer nothing."""
    import importlib

    from hf_posenc.recipes import evaluate, finetune, finetune_checks, finetune_config

    for module, old in [(finetune_checks, "Plan"), (finetune_config, "Config"), (evaluate, "variant_plan"),
                        (finetune, "freeze_unreached"), (finetune, "evaluate")]:
        assert not hasattr(module, old), old
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("hf_posenc.recipes.config")


# ------------------------------------------------------------------------------------- phases in order
ORDER = "setup -> resume -> train_step / train -> save_final -> cleanup"


def refused(call, *said):
    """`call()` raises PhaseOrderError whose message holds each of `said`."""
    from hf_posenc.recipes.finetune_recipe import PhaseOrderError

    with pytest.raises(PhaseOrderError) as err:
        call()
    assert isinstance(err.value, hp.PosEncError)
    for words in said:
        assert words in str(err.value), str(err.value)
    return str(err.value)


def test_phases_out_of_order_are_refused_naming_the_order_and_the_run_stays_straight(tmp_path, tiny_dir,  # noqa: F811
                                                                                      text_file):  # noqa: F811
    """Every phase called out of order raises one PhaseOrderError naming the order, before it changes
    anything: a run by hand with each wrong call tried on the way (a second resume, a step skipped, taken
    twice or past train.steps, a checkpoint of another step than the last taken) ends bit for bit as the
    straight run, its log the straight run's."""
    straight = recipe_for(tmp_path / "a", tiny_dir, text_file, "--output_dir", str(tmp_path / "a" / "out"))
    straight.setup()
    expected = state(straight.train())

    out = tmp_path / "b" / "out"
    recipe = recipe_for(tmp_path / "b", tiny_dir, text_file, "--output_dir", str(out))
    for call in (recipe.resume, lambda: recipe.train_step(1), recipe.train, lambda: recipe.save_checkpoint(1),
                 recipe.save_final, recipe.cleanup, recipe.evaluate, recipe.setup_data, recipe.setup_optimizer):
        refused(call, "before setup()", ORDER)
    assert not out.exists()
    recipe.setup_accelerator()
    refused(recipe.setup, "after setup_accelerator() (setup_data() is next)")
    refused(recipe.setup_model, "(setup_data() is next)")
    recipe.setup_data()
    recipe.setup_model()
    recipe.before = recipe.evaluate()
    recipe.setup_optimizer()
    refused(lambda: recipe.train_step(1), "after setup() (resume() is next)", ORDER)
    refused(lambda: recipe.save_checkpoint(3), "after setup() (resume() is next)")   # was: step 3, step-0 weights
    assert not (out / "checkpoints").exists()
    assert recipe.resume() == 0
    refused(lambda: recipe.save_checkpoint(0), "saves the step last taken, and none is taken yet")
    for step in (0, 2, 3, 99, 1.0, True, "1"):
        refused(lambda: recipe.train_step(step), "the next step is 1 (the last step taken is 0)")
    recipe.train_step(1)
    refused(recipe.resume, "after resume()", ORDER)          # was: the data rewound, the weights not
    refused(lambda: recipe.train_step(1), "the next step is 2 (the last step taken is 1)")
    refused(lambda: recipe.save_checkpoint(3), "saves the step last taken, 1: call save_checkpoint(1)")
    recipe.save_checkpoint(1)
    for step in range(2, 7):
        recipe.train_step(step)
        if step % 2 == 0:
            recipe.save_checkpoint(step)
    refused(lambda: recipe.train_step(7), "train_step(7): the run has train.steps=6, all taken; save_final() is next")
    final = recipe.save_final()
    for call in (lambda: recipe.train_step(7), recipe.train, recipe.save_final, lambda: recipe.save_checkpoint(6)):
        refused(call, "after save_final() (cleanup() is next)")
    recipe.cleanup()
    refused(recipe.cleanup, "after cleanup(): the run is over")
    refused(recipe.setup, "after cleanup()")

    assert [r["loss"] for r in ckpt.read_log(out)] == [r["loss"] for r in ckpt.read_log(tmp_path / "a" / "out")]
    for k, v in state(final).items():
        assert torch.equal(v, expected[k]), k
    assert [p.name for p in ckpt.complete_checkpoints(out)] == ["step_0000004", "step_0000006"]
    refused(straight.train, "after cleanup(): the run is over")   # train() ends with cleanup


def test_every_config_field_declares_whether_resume_may_change_it():
    """--resume compares each setting with the saved run's: every field of every section says whether a
    resume may change it (finetune_config.FIXED / ADJUSTABLE / PER_COMMAND), so a new field cannot be left
    out of the comparison. What makes the run what it is is fixed; the cadence, logging and steps are not."""
    import dataclasses

    from hf_posenc.recipes import finetune_config as FC

    declared = {}
    for section in dataclasses.fields(FC.FinetuneConfig):
        kind = FC.FinetuneConfig.__dataclass_fields__[section.name].default_factory \
            if section.default_factory is not dataclasses.MISSING else None
        fields = dataclasses.fields(kind) if kind is not None and dataclasses.is_dataclass(kind) else [section]
        prefix = f"{section.name}." if kind is not None and dataclasses.is_dataclass(kind) else ""
        for f in fields:
            assert isinstance(f.metadata.get("resume_may_change"), bool), f"{prefix}{f.name} is not classified"
            declared[prefix + f.name] = f.metadata["resume_may_change"]
    assert len(declared) >= 45
    for key in ("model.name", "model.dtype", "posenc", "data.corpus", "data.seq_len", "data.short_share",
                "train.positions", "train.seed", "train.lr", "train.scheduler", "train.warmup_steps",
                "train.batch_size", "train.grad_accum", "train.objective", "train.trainable", "train.lora"):
        assert declared[key] is False, key
    for key in ("train.steps", "train.save_every", "train.keep_checkpoints", "train.report_to", "eval.every",
                "eval.lengths", "resume", "output_dir"):
        assert declared[key] is True, key


def test_settings_compare_as_saved_nan_and_tuples_included(tmp_path):
    """setting_changes compares a config with its finetune_config.json: a tuple read back as a list and a
    NaN (which equals nothing) are the same setting; true is not 1; a key the saved file lacks is its
    default; each change carries whether a resume may make it."""
    from hf_posenc.recipes import finetune_checks as checks
    from hf_posenc.recipes.finetune_config import FinetuneConfig, TrainArgs

    cfg = FinetuneConfig(posenc={"method": "longrope", "short_factor": (1.0, 2.0), "attention_factor": float("nan")})
    saved = json.loads(json.dumps(cfg.to_dict()))
    assert checks.setting_changes(cfg, saved) == []
    del saved["train"]["seed"], saved["eval"]                      # settings added since: their defaults
    assert checks.setting_changes(cfg, saved) == []
    saved["data"]["framing"] = 1
    saved["train"]["steps"] = 7
    saved["output_dir"] = "elsewhere"                              # per command: not compared
    assert checks.setting_changes(cfg, saved) == [("data.framing", False, 1, "auto"), ("train.steps", True, 7, 400)]
    cfg.data.framing = "bos"
    assert [c[0] for c in checks.setting_changes(cfg, saved)] == ["data.framing", "train.steps"]
    assert not checks.lr_follows_steps(TrainArgs(scheduler="constant_with_warmup", warmup_steps=2), 6, 10)
    assert checks.lr_follows_steps(TrainArgs(scheduler="linear", warmup_steps=2), 6, 10)
    assert checks.lr_follows_steps(TrainArgs(scheduler="cosine", warmup_steps=2), 6, 10)


def test_the_card_says_whether_the_evaluation_text_was_held_out(tmp_path, tiny_dir, text_file):  # noqa: F811
    from hf_posenc.recipes.finetune_card import write_model_card

    recipe = recipe_for(tmp_path, tiny_dir, text_file)
    for corpus, said in [(None, f"## Evaluation (on `{text_file.name}`, the training text itself: not held out"),
                         (str(text_file), "the training text itself: not held out"),
                         ("shakespeare:macbeth", "## Evaluation (on held-out `shakespeare:macbeth`)")]:
        recipe.cfg.eval.corpus = corpus
        write_model_card(str(tmp_path), recipe.cfg, recipe.preflight, {}, 3, 384, {}, {})
        card = (tmp_path / "README.md").read_text()
        assert said in card and "3 optimizer steps, 384 training tokens" in card
        assert ("held-out" in card) == (corpus == "shakespeare:macbeth")
        assert str(text_file) not in card and str(tiny_dir) not in card   # names, no machine path


@pytest.mark.parametrize("saved_bos,framing,refused", [(False, "none", False), (True, "bos", False),
                                                        ("auto", "auto", False), (False, "auto", True)])
def test_a_run_saved_with_data_bos_resumes_under_its_framing(tmp_path, saved_bos, framing, refused):
    """Runs saved before data.bos became data.framing (true / false / auto: bos / none / auto) resume unchanged;
    any other framing is a change of the data, refused naming it."""
    cfg = FinetuneConfig(output_dir=str(tmp_path), resume=True)
    cfg.data.framing = framing
    saved = json.loads(json.dumps(cfg.to_dict()))
    del saved["data"]["framing"]
    saved["data"]["bos"] = saved_bos
    (tmp_path / "finetune_config.json").write_text(json.dumps(saved))
    if refused:
        with pytest.raises(ConfigError, match=r'data\.framing "none" -> "auto"'):
            checks.check_resume(cfg)
    else:
        assert checks.check_resume(cfg) == ()
