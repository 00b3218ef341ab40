"""The evaluate recipe's remaining tracebacks and silent answers: a learned-table model whose
variant extends its table (the time estimate ran the model as loaded past its table), an encoder (refused before
loading), a length far past every context (refused before any input is built), a resume with changed settings
(each named with both values; settings no asked measure reads ignored), results.json as strict JSON (NaN written
as null with a note, read back on a rerun), and the "to do" line of a resumed run (what is left)."""

from __future__ import annotations

import json
import math
import re

import pytest
import torch
from transformers import AutoConfig, AutoModel

from hf_posenc.eval import ruler
from hf_posenc.recipes import evaluate as recipe
from hf_posenc.recipes import evaluate_config
from refusals import one_line_refusal
from tiny import TINY_TEXT_VOCAB, save_text_models, tiny_model, write_corpus

TEXT = "".join(f"Line {i}: the {['king', 'queen', 'fool'][i % 3]} speaks of {i * 7 % 13} ravens.\n" for i in range(60))


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    """A tiny Llama, a tiny GPT-2 (a 64-position table), a tiny BERT encoder, a Llama whose head gives NaN, and
    a corpus of two documents."""
    path = tmp_path_factory.mktemp("recipe40")
    nan = tiny_model(vocab_size=TINY_TEXT_VOCAB)
    with torch.no_grad():
        nan.lm_head.weight.fill_(float("nan"))
    bert = AutoModel.from_config(AutoConfig.for_model(
        "bert", vocab_size=TINY_TEXT_VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, max_position_embeddings=64))
    save_text_models(path, llama=tiny_model(vocab_size=TINY_TEXT_VOCAB), nan=nan, bert=bert,
                     gpt2=tiny_model("gpt2", vocab_size=TINY_TEXT_VOCAB, bos_token_id=0, eos_token_id=0))
    write_corpus(path / "corpus", TEXT)
    return path


def argv(root, model: str, out, *extra) -> list[str]:
    return ["--model.name", str(root / model), "--model.dtype", "float32", "--data.corpus", str(root / "corpus"),
            "--output_dir", str(out), "--eval.max_position_embeddings", "256", "--plots", "false", *extra]


def refusal(capsys, args) -> str:
    """The recipe's one `error:` line (exit code 2, no traceback)."""
    return one_line_refusal(capsys, recipe.main, args)


def no_loading(monkeypatch):
    monkeypatch.setattr(recipe.hp, "load_model", lambda *a, **k: pytest.fail("the weights loaded"))


def test_a_variant_that_extends_a_learned_table_is_timed_as_patched(root, tmp_path, capsys):
    """GPT-2's table holds 64 positions; `sinusoidal` takes 128. The estimate timed the model as loaded at 128
    tokens: an IndexError before the first measure."""
    results = recipe.main(argv(root, "gpt2", tmp_path, "--eval.variants", "sinusoidal", "--eval.perplexity_lengths",
                               "128", "--eval.perplexity_documents", "1"))
    assert results["variants"]["sinusoidal"]["lengths"]["lengths"] == [128]
    assert re.search(r"^to do: 1 evaluation\(s\) x 1 forward passes of up to 128 tokens; .*timed passes of 128 and "
                     r"128 tokens\)$", capsys.readouterr().err, re.M)


@pytest.mark.parametrize("measure", [["--eval.recall_lengths", "60", "--eval.recall_passages", "2",
                                      "--eval.recall_passage_tokens", "8"],
                                     ["--eval.tasks", "passkey", "--eval.task_lengths", "400"],
                                     ["--eval.perplexity_lengths", "32"]], ids=["recall", "tasks", "perplexity"])
def test_an_encoder_is_refused_before_its_weights_load(root, tmp_path, capsys, monkeypatch, measure):
    no_loading(monkeypatch)
    said = refusal(capsys, argv(root, "bert", tmp_path / "out", "--eval.variants", "none", *measure))
    assert re.search(r"model '.*bert' is a BertModel \(bert\), not a causal LM; the evaluate recipe scores each "
                     r"next token", said), said
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("field, value, says", [
    ("task_lengths", "10000000", r"eval\.task_lengths 10000000 is past 8192 tokens, the most a length may be: 32 x "
                                 r"the longest context in play \(256: the model's own 64 and "
                                 r"eval\.max_position_embeddings \[256\]\)"),
    ("recall_lengths", "10000000", r"eval\.recall_lengths 10000000"),   # (recall's own layout bound may say it first)
    ("curve_length", "10000000", r"eval\.curve_length 10000000 is past 8192 tokens"),
    ("task_lengths", "3000000000", r"eval\.task_lengths must hold token counts <= 2147483647 .*got \[3000000000\]"),
])
def test_a_length_far_past_every_context_is_refused_before_loading(root, tmp_path, capsys, monkeypatch, field,
                                                                   value, says):
    no_loading(monkeypatch)
    extra = ["--eval.tasks", "passkey"] if field == "task_lengths" else []
    said = refusal(capsys, argv(root, "llama", tmp_path / "out", "--eval.variants", "none", f"--eval.{field}", value,
                                *extra))
    assert re.search(says, said), said


def test_a_length_past_a_table_is_refused_before_the_inputs_are_built(root, tmp_path, capsys, monkeypatch):
    """GPT-2's 64 positions against RULER samples of 400 tokens: refused before make_samples builds them."""
    monkeypatch.setattr(ruler, "make_samples", lambda *a, **k: pytest.fail("samples built"))
    said = refusal(capsys, argv(root, "gpt2", tmp_path / "out", "--eval.variants", "none", "--eval.tasks", "passkey",
                                "--eval.task_lengths", "400"))
    assert "variant 'none' cannot take the 400 tokens" in said


PERPLEXITY = ["--eval.variants", "none", "--eval.perplexity_lengths", "32", "--eval.perplexity_documents", "1"]


def test_a_resume_with_other_settings_names_each_and_both_values(root, tmp_path, capsys, monkeypatch):
    recipe.main(argv(root, "llama", tmp_path, *PERPLEXITY))
    before = (tmp_path / "results.json").read_text()
    said = refusal(capsys, argv(root, "llama", tmp_path, *PERPLEXITY[:-1], "2", "--eval.curve_length", "64",
                                "--model.attn_implementation", "eager"))
    assert ("already holds another configuration: model.attn_implementation \"sdpa\" -> \"eager\", "
            "eval.perplexity_documents 1 -> 2, eval.curve_length 0 -> 64 (saved -> this command)") in said, said
    assert (tmp_path / "results.json").read_text() == before
    # settings no asked measure reads change nothing: the run resumes, nothing measured again
    monkeypatch.setattr(recipe, "evaluate_variant", lambda *a, **k: pytest.fail("measured again"))
    for unread in (["--eval.task_needles", "6", "--eval.task_hops", "2"], ["--eval.curve_bucket", "16"],
                   ["--eval.recall_passages", "3", "--eval.trials", "4", "--eval.depths", "0.2"]):
        assert set(recipe.main(argv(root, "llama", tmp_path, *PERPLEXITY, *unread))["variants"]) == {"none"}


def test_a_resume_ignores_task_needles_without_a_needle_family_and_names_them_with_one(root, tmp_path, capsys,
                                                                                        monkeypatch):
    tasks = ["--eval.variants", "none", "--eval.tasks", "vt", "--eval.task_lengths", "600", "--eval.task_samples", "1"]
    recipe.main(argv(root, "llama", tmp_path, *tasks))
    said = refusal(capsys, argv(root, "llama", tmp_path, *tasks, "--eval.task_hops", "2"))   # vt reads its hops
    assert "eval.task_hops 4 -> 2" in said
    monkeypatch.setattr(recipe, "evaluate_variant", lambda *a, **k: pytest.fail("measured again"))
    recipe.main(argv(root, "llama", tmp_path, *tasks, "--eval.task_needles", "6"))   # no needle family: unread
    assert recipe.unread({**recipe.dataclasses.asdict(evaluate_config.EvalArgs()), "tasks": ["multikey"]}) >= {"task_hops"}
    assert "task_needles" not in recipe.unread({**recipe.dataclasses.asdict(evaluate_config.EvalArgs()), "tasks": ["multikey"]})


def no_nan(text: str):
    """json.loads that refuses NaN and Infinity (strict JSON)."""
    def refuse(constant):
        raise ValueError(f"not strict JSON: {constant}")
    return json.loads(text, parse_constant=refuse)


def test_results_json_is_strict_json_with_a_note_and_a_rerun_reads_the_nan_back(root, tmp_path, capsys, monkeypatch):
    args = argv(root, "nan", tmp_path, *PERPLEXITY, "--eval.curve_length", "64", "--eval.curve_bucket", "16")
    results = recipe.main(args)
    assert math.isnan(results["variants"]["none"]["lengths"]["perplexity"][0])   # in memory: as measured
    saved = no_nan((tmp_path / "results.json").read_text())
    assert saved["variants"]["none"]["lengths"]["perplexity"] == [None]
    assert saved["not_finite"]["note"].startswith("JSON has no NaN or infinity: these values are written as null")
    assert [["variants", "none", "lengths", "perplexity", 0], "nan"] in saved["not_finite"]["values"]
    summary = (tmp_path / "summary.md").read_text()
    assert "| none | - | one pass |" in summary
    monkeypatch.setattr(recipe, "evaluate_variant", lambda *a, **k: pytest.fail("measured again"))
    again = recipe.main(args)   # resumed: the NaN read back, the summary the same
    assert math.isnan(again["variants"]["none"]["lengths"]["perplexity"][0])
    assert (tmp_path / "summary.md").read_text() == summary
    assert no_nan((tmp_path / "results.json").read_text())["not_finite"] == saved["not_finite"]


def test_strict_json_lists_each_value_and_an_edited_list_is_refused(tmp_path):
    text = recipe.strict_json({"a": {"b": [1.0, float("inf")], "c": float("-inf")}, "d": math.nan})
    saved = no_nan(text)
    assert saved["a"] == {"b": [1.0, None], "c": None} and saved["d"] is None
    assert saved["not_finite"]["values"] == [[["a", "b", 1], "inf"], [["a", "c"], "-inf"], [["d"], "nan"]]
    back = recipe.restore_not_finite(saved, tmp_path / "results.json")
    assert back["a"]["b"][1] == math.inf and back["a"]["c"] == -math.inf and math.isnan(back["d"])
    assert "not_finite" not in back
    with pytest.raises(recipe.ConfigError, match="names .*'x'.*which holds no null there"):
        recipe.restore_not_finite({"not_finite": {"values": [[["x"], "nan"]]}}, tmp_path / "results.json")
    assert "not_finite" not in no_nan(recipe.strict_json({"a": 1.5}))


def test_the_to_do_line_of_a_resumed_run_counts_what_is_left(root, tmp_path, capsys, monkeypatch):
    """Two RULER cells (400 and 500 tokens); the run stopped after the first: the rerun has one pass left."""
    args = argv(root, "llama", tmp_path, "--eval.variants", "none", "--eval.tasks", "passkey", "--eval.task_lengths",
                "400", "500", "--eval.task_samples", "1")
    real, calls = ruler.score_samples, []

    def second_interrupted(*a, **k):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(*a, **k)

    monkeypatch.setattr(ruler, "score_samples", second_interrupted)
    with pytest.raises(SystemExit):
        recipe.main(args)
    assert re.search(r"^to do: 1 evaluation\(s\) x 2 forward passes of up to 500 tokens; ", capsys.readouterr().err,
                     re.M)
    monkeypatch.setattr(ruler, "score_samples", real)
    recipe.main(args)
    err = capsys.readouterr().err
    assert re.search(r"^to do: 1 evaluation\(s\) x 1 forward passes of up to 500 tokens; .*; done already "
                     r"\(results\.json\): 1 recall / task cell\(s\)$", err, re.M), err
    capsys.readouterr()
    recipe.main(args)   # everything saved: nothing left, nothing timed
    assert re.search(r"^to do: nothing left; done already \(results\.json\): 1 evaluation\(s\)$",
                     capsys.readouterr().err, re.M)
