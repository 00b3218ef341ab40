"""Recall at a distance, RULER's retrieval families and the intervals of hf_posenc/eval (recall.py, ruler.py,
stats.py), and the evaluate recipe's recall / task cells, on tiny models and a byte-level tokenizer; wrong-type,
empty and out-of-range input to them refused in one line that names the argument, before any forward."""

from __future__ import annotations

import json
import math
import random
from functools import cache

import pytest
import torch
from refusals import CallCase, encoder, llama, refused_in_one_line, table, tok
from test_eval_recipe import TEXT, checkpoint, corpus_dir, recipe  # noqa: F401  (fixtures)
from tiny import TINY_TEXT_VOCAB, tiny_model, tiny_tokenizer

import hf_posenc as hp
from hf_posenc.eval import probes, recall, ruler, stats
from hf_posenc.eval.perplexity import token_nll

PROSE = "".join(f"Verse {i}: and the {random.Random(i).choice(['lamb', 'lion', 'dove', 'vine'])} went unto "
                f"{random.Random(i + 99).randint(100, 999)} hills by the river.\n" for i in range(400))


# -- stats ---------------------------------------------------------------------------------------------

def test_wilson_matches_the_formula_and_stays_inside_0_1():
    # Wilson's interval for 5/10: 0.2366 .. 0.7634 (the textbook value); 0/10 reaches 0.2775, never below 0
    mid, none, all_ = stats.wilson(5, 10), stats.wilson(0, 10), stats.wilson(10, 10)
    assert (round(mid["low"], 4), round(mid["high"], 4)) == (0.2366, 0.7634)
    assert none["low"] == 0 and round(none["high"], 4) == 0.2775 and all_["high"] == 1
    assert math.isnan(stats.wilson(0, 0)["accuracy"])
    with pytest.raises(hp.InvalidInputError):
        stats.wilson(3, 2)


def test_bootstrap_interval_holds_the_mean_shrinks_with_n_and_is_reproducible():
    rng = random.Random(0)
    small, large = [rng.gauss(1, 1) for _ in range(12)], [rng.gauss(1, 1) for _ in range(400)]
    a, b = stats.bootstrap_mean(small), stats.bootstrap_mean(large)
    assert a["low"] < a["mean"] < a["high"] and b["low"] < b["mean"] < b["high"]
    assert b["half_width"] < a["half_width"] / 3            # ~ 1 / sqrt(n)
    assert abs(b["half_width"] - 1.96 / math.sqrt(400)) < 0.03
    assert stats.bootstrap_mean(small) == a
    with pytest.raises(hp.InvalidInputError):
        stats.bootstrap_mean([1.0, float("nan")])


def test_a_paired_difference_sees_a_shift_the_unpaired_intervals_hide():
    rng = random.Random(1)
    base = [rng.gauss(0, 2) for _ in range(48)]        # how hard each passage is: shared by both variants
    a, b = [x + 0.2 + rng.gauss(0, 0.05) for x in base], base
    assert stats.bootstrap_mean(a)["low"] < stats.bootstrap_mean(b)["high"]    # the intervals overlap
    d = stats.paired_difference(a, b)
    assert d["differs"] and 0.15 < d["mean"] < 0.25
    assert not stats.paired_difference(base, base)["differs"]
    with pytest.raises(hp.InvalidInputError):
        stats.paired_difference([1, 2], [1])


def test_effective_length_is_the_last_length_before_the_first_fall():
    assert stats.effective_length({4096: 0.9, 8192: 0.88, 16384: 0.5, 32768: 0.9}, 0.856) == 8192
    assert stats.effective_length({4096: 0.5}, 0.856) is None


# -- layout and sequences ----------------------------------------------------------------------------------

def spans(layout):
    size = layout.passage_tokens
    return sorted([(f, f + size) for f in layout.firsts] + [(r, r + size) for r in layout.repeats])


@pytest.mark.parametrize("distances", [None, [100, 300, 700]])
def test_passages_never_overlap_and_sit_at_the_distances_asked(distances):
    layout = recall.plan_layout(1024, passages=6, passage_tokens=32, distances=distances, head=1, seed=3)
    taken = spans(layout)
    assert all(a[1] <= b[0] for a, b in zip(taken, taken[1:])) and taken[0][0] >= 1 and taken[-1][1] <= 1024
    assert all(r > f for f, r in zip(layout.firsts, layout.repeats))
    if distances:   # each within one slot of what was asked (round robin over the list)
        pitch = max(abs(d - distances[i % 3]) for i, d in enumerate(layout.distances))
        assert pitch <= (1024 - 1) // 12
    else:           # first copies in the first half, repeats in the second
        assert max(layout.firsts) < 512 < min(layout.repeats)


@pytest.mark.parametrize("kw, words", [
    (dict(length=300, passages=4, passage_tokens=64), "need 512 tokens"),
    (dict(length=1024, passages=2, passage_tokens=32, distances=[1000]), "distance 1000 does not fit"),
    (dict(length=1024, passages=2, passage_tokens=32, distances=[]), "distances is empty"),
    (dict(length=1024, passages=0), "passages"),
    (dict(length=1024, passages=2, passage_tokens=4), "passage_tokens"),
])
def test_a_layout_that_cannot_fit_is_refused_naming_why(kw, words):
    with pytest.raises(hp.InvalidParameterError, match=words):
        recall.plan_layout(**kw)


def test_the_control_differs_only_in_the_first_copies_and_the_repeats_are_the_passages():
    tok = tiny_tokenizer()
    layout = recall.plan_layout(1200, passages=5, passage_tokens=40, head=1, seed=0)
    sets = recall.make_recall(tok, PROSE, layout, sequences=2, seed=0, prefix=[256])
    size, seen = layout.passage_tokens, set()
    for s in sets:
        assert len(s.with_copy) == len(s.control) == 1200 and s.with_copy[0] == s.control[0] == 256
        firsts = {p for f in layout.firsts for p in range(f, f + size)}
        assert all(a == b for i, (a, b) in enumerate(zip(s.with_copy, s.control)) if i not in firsts)
        for f, r in zip(layout.firsts, layout.repeats):
            assert s.with_copy[f:f + size] == s.with_copy[r:r + size] == s.control[r:r + size]
            assert s.control[f:f + size] != s.with_copy[f:f + size]
            seen.add(tuple(s.with_copy[f:f + size]))
    assert len(seen) == 10      # every passage its own
    with pytest.raises(hp.InvalidInputError, match="recall text has"):
        recall.make_recall(tok, PROSE[:1000], layout, prefix=[256])


def test_gaps_are_the_control_loss_minus_the_loss_with_the_copy():
    model, tok = tiny_model(vocab_size=TINY_TEXT_VOCAB, max_position_embeddings=1024), tiny_tokenizer()
    layout = recall.plan_layout(600, passages=3, passage_tokens=32, seed=0)
    (s,) = recall.make_recall(tok, PROSE, layout, seed=0)
    rows = recall.score_recall(model, [s], progress=False)
    with_nll, base_nll = (token_nll(model, torch.tensor([ids]))[0] for ids in (s.with_copy, s.control))
    for row, r in zip(rows, layout.repeats):   # tokens 2..32 of the repeat: its first token is unpredictable
        expected = base_nll[r:r + 31].mean() - with_nll[r:r + 31].mean()
        assert row["gap"] == pytest.approx(expected.item(), abs=1e-6) and row["form"] == "control"
    one = recall.score_recall(model, [s], control=False, progress=False)
    f = layout.firsts[0]
    assert one[0]["baseline"] == pytest.approx(with_nll[f:f + 31].mean().item(), abs=1e-6)
    assert one[0]["form"] == "one-pass" and recall.summarize_recall(one)["form"] == "one-pass"


def test_the_recall_distance_is_where_the_gap_falls_below_half_the_shortest():
    rows = [{"sequence": 0, "passage": i, "distance": d, "gap": g, "repeat_at": 8000, "form": "control"}
            for i, (d, g) in enumerate([(500, 2.0), (700, 2.2), (1500, 1.6), (1700, 1.4), (2500, 0.5), (2700, 0.7),
                                         (3500, 1.9), (3700, 2.0)])]
    out = recall.summarize_recall(rows, length=4096, bin_width=1024)
    assert [b["n"] for b in out["bins"]] == [2, 2, 2, 2] and out["recall_distance"] == 2048
    assert not out["beyond_measured"] and out["gap"]["n"] == 8
    held = recall.summarize_recall([dict(r, gap=2.0) for r in rows], length=4096, bin_width=1024)
    assert held["beyond_measured"] and held["recall_distance"] == 3700


# -- retrieval families ---------------------------------------------------------------------------------

@pytest.mark.parametrize("family", ruler.TASKS)
def test_every_family_is_canonical_fits_its_length_and_answers_in_the_prompt(family):
    tok = tiny_tokenizer()
    samples = ruler.make_samples(family, tok, lengths=[900], samples=2, haystack=PROSE, seed=5)
    assert samples == ruler.make_samples(family, tok, lengths=[900], samples=2, haystack=PROSE, seed=5)
    for sample in samples:
        assert len(sample.probes) == (4 if family == "multikey" else 1)
        for p in sample.probes:
            full = p.prompt + p.answer
            assert 900 - 100 < len(full) <= 900     # whole haystack lines: within one line of the length
            assert tok(tok.decode(full), add_special_tokens=False)["input_ids"] == full
            answer = tok.decode(p.answer).strip()
            assert answer and answer.split(",")[0].split()[0] in tok.decode(p.prompt)   # the needle is there
            assert 0 < p.distance < len(p.prompt)


@pytest.mark.parametrize("kw, error", [
    (dict(family="nope"), hp.InvalidParameterError), (dict(lengths=[20]), hp.InvalidParameterError),
    (dict(depths=[1.5]), hp.InvalidParameterError), (dict(haystack=None), hp.InvalidInputError),
    (dict(needles=1), hp.InvalidParameterError),
])
def test_impossible_samples_are_refused(kw, error):
    args = dict(family="multikey", lengths=[900], haystack=PROSE) | kw
    with pytest.raises(error):
        ruler.make_samples(args.pop("family"), tiny_tokenizer(), **args)


def test_multikey_probes_share_one_prefill_and_score_as_full_passes():
    model, tok = tiny_model(vocab_size=TINY_TEXT_VOCAB, max_position_embeddings=1024), tiny_tokenizer()
    samples = ruler.make_samples("multikey", tok, lengths=[600], samples=1, haystack=PROSE, seed=0)
    rows = ruler.score_samples(model, samples, progress=False)
    assert len(rows) == 4 and all(r["shared"] for r in rows)
    for r, p in zip(rows, samples[0].probes):
        with torch.no_grad():
            logits = model(torch.tensor([p.prompt + p.answer])).logits[0, len(p.prompt) - 1:-1]
        expected = logits.log_softmax(-1).gather(-1, torch.tensor(p.answer)[:, None]).sum().item()
        assert r["logprob"] == pytest.approx(expected, abs=1e-4)
    cell = ruler.summarize_samples(rows)["multikey"]["cells"][600]
    assert cell["n"] == 4 and cell["low"] <= cell["accuracy"] <= cell["high"] and cell["shared"]


def test_a_one_probe_sample_is_said_to_be_one_probe_and_a_fall_back_to_fall_back():
    """A one-probe sample once read "a full pass per probe" in summary.md, as a method that fell back."""
    from hf_posenc.eval import report

    model, tok = tiny_model(vocab_size=TINY_TEXT_VOCAB, max_position_embeddings=1024), tiny_tokenizer()
    one = ruler.score_samples(model, ruler.make_samples("passkey", tok, lengths=[600], samples=2), progress=False)
    dynamic = hp.patch(tiny_model(vocab_size=TINY_TEXT_VOCAB, max_position_embeddings=256), "dynamic", factor=4)
    many = ruler.make_samples("multikey", tok, lengths=[600], samples=1, haystack=PROSE)
    fell = ruler.score_samples(dynamic, many, progress=False)
    shared = ruler.score_samples(model, many, progress=False)
    assert {r["prefill"] for r in one} == {"one probe"} and {r["prefill"] for r in fell} == {"fell back"}
    tasks = {name: {family: cell for family, cell in ruler.summarize_samples(rows).items()}
             for name, rows in (("one", one), ("fell", fell), ("shared", shared))}
    lines = report.task_lines({name: {"tasks": t} for name, t in tasks.items()}, {n: n for n in tasks})
    column = {line.split(" | ")[0].strip("| "): line.split(" | ")[5] for line in lines if line.startswith("| ")
              and " | 600 | " in line}
    assert column == {"one": "one probe", "fell": "fell back: a full pass per probe", "shared": "shared"}
    # a task cell of a run from before cells recorded their prefill (no "prefill") still reads as it did
    old = {**tasks["shared"]["multikey"]["cells"][600]}
    del old["prefill"]
    assert report.prefill_text(old) == "shared" and report.prefill_text({**old, "shared": False}) == \
        "a full pass per probe"


# -- the recipe ----------------------------------------------------------------------------------------

def run_recall(checkpoint, corpus_dir, out, *extra):
    return recipe.main(["--model.name", str(checkpoint), "--model.dtype", "float32", "--data.corpus",
                        str(corpus_dir), "--output_dir", str(out), "--eval.variants", "none", "yarn",
                        "--eval.max_position_embeddings", "512", "--eval.recall_lengths", "512",
                        "--eval.recall_passages", "4", "--eval.recall_passage_tokens", "24", "--eval.tasks",
                        "passkey", "multikey", "--eval.task_lengths", "700", "--eval.task_samples", "2", *extra])


def test_the_recipe_measures_recall_and_tasks_with_intervals_and_resumes_cell_by_cell(
        checkpoint, corpus_dir, tmp_path, monkeypatch):  # noqa: F811
    results = run_recall(checkpoint, corpus_dir, tmp_path)
    yarn = results["variants"]["yarn"]
    cell = yarn["recall"]["512"]
    assert cell["gap"]["n"] == 4 and cell["form"] == "control" and len(cell["passages"]) == 4
    assert yarn["tasks"]["multikey"]["cells"][700]["n"] == 8 and yarn["tasks"]["passkey"]["cells"][700]["n"] == 2
    summary = (tmp_path / "summary.md").read_text()
    assert "Recall at a distance" in summary and "(n 4)" in summary and "Retrieval families" in summary
    assert (tmp_path / "recall.png").stat().st_size > 0 and (tmp_path / "tasks.png").stat().st_size > 0
    # a run killed inside a variant keeps its finished cells: the rerun takes them and measures only the rest
    saved = json.loads((tmp_path / "results.json").read_text())
    saved["partial"] = {"yarn": {"recall 512": saved["variants"]["yarn"]["recall"]["512"]}}
    del saved["variants"]["yarn"]
    # the values results.json lists as not finite (strict JSON) move with the cell; the deleted variant's others go
    cell_at = ["variants", "yarn", "recall", "512"]
    values = saved.get("not_finite", {}).get("values", [])
    saved.get("not_finite", {})["values"] = [
        [["partial", "yarn", "recall 512", *where[4:]] if where[:4] == cell_at else where, value]
        for where, value in values if where[:2] != ["variants", "yarn"] or where[:4] == cell_at]
    (tmp_path / "results.json").write_text(json.dumps(saved))
    monkeypatch.setattr(recall, "score_recall", lambda *a, **k: pytest.fail("recall measured again"))
    again = run_recall(checkpoint, corpus_dir, tmp_path)
    assert again["variants"]["yarn"]["recall"]["512"]["gap"] == cell["gap"] and not again["partial"]


@pytest.mark.parametrize("extra, words", [
    (["--eval.recall_passage_tokens", "300"], "need 600 tokens"),
    (["--eval.recall_distances", "9000"], "does not fit"),
    (["--eval.tasks", "bogus"], "unknown 'bogus'"),
    (["--eval.depths", "1.5"], "depths"),
])
def test_recall_and_tasks_that_cannot_run_are_refused_before_loading(checkpoint, corpus_dir, tmp_path, capsys,
                                                                     monkeypatch, extra, words):  # noqa: F811
    monkeypatch.setattr(hp, "load_model", lambda *a, **k: pytest.fail("loaded a model"))
    with pytest.raises(SystemExit) as stop:
        run_recall(checkpoint, corpus_dir, tmp_path / "out", *extra)
    err = capsys.readouterr().err.strip().splitlines()
    assert stop.value.code == 2 and err[-1].startswith("error: ") and words in err[-1]
    assert not (tmp_path / "out").exists()


# -- wrong-type, empty and out-of-range input to recall, RULER and the intervals: one line naming the argument ------

VERSES = "".join(f"Verse {i}: and the lamb went unto {100 + i} hills by the river.\n" for i in range(400))


@cache
def layout():
    return recall.plan_layout(512, passages=2, passage_tokens=16)


@cache
def sets():
    return recall.make_recall(tok(), VERSES, layout())


@cache
def recall_rows():
    return recall.score_recall(llama(), sets(), progress=False)


@cache
def samples():
    return ruler.make_samples("passkey", tok(), lengths=[600], samples=1)


@cache
def sample_rows():
    return ruler.score_samples(llama(), samples(), progress=False)


CALL_CASES = [
    # eval.recall
    CallCase("make_recall-text-none", lambda: recall.make_recall(tok(), None, layout()), hp.InvalidInputError,
             "the recall text must be a str or its token ids (a list of ints), got None"),
    CallCase("make_recall-text-int", lambda: recall.make_recall(tok(), 5, layout()), hp.InvalidInputError,
             "got 5 (int)"),
    CallCase("make_recall-text-words", lambda: recall.make_recall(tok(), ["a", "b"], layout()), hp.InvalidInputError,
             "the recall text's token ids must be token ids (a list of ints), but it holds 'a'"),
    CallCase("make_recall-layout-none", lambda: recall.make_recall(tok(), VERSES, None), hp.ParameterTypeError,
             "layout must be a Layout (plan_layout gives one), got None"),
    CallCase("make_recall-prefix-none", lambda: recall.make_recall(tok(), VERSES, layout(), prefix=None),
             hp.InvalidInputError, "prefix must be token ids (a list of ints), got None"),
    CallCase("make_recall-tokenizer-none", lambda: recall.make_recall(None, VERSES, layout()), hp.InvalidInputError,
             "tokenizer must be a transformers tokenizer"),
    CallCase("plan_layout-distances-int", lambda: recall.plan_layout(512, passages=2, passage_tokens=16, distances=100),
             hp.ParameterTypeError, "distances must be a list of ints (token distances) or None, got 100"),
    CallCase("plan_layout-length-huge", lambda: recall.plan_layout(10**7, passages=2), hp.InvalidParameterError,
             "length must be <= 1048576, got 10000000"),
    CallCase("distance_bins-length-0", lambda: recall.distance_bins(0), hp.InvalidParameterError,
             "length must be >= 1, got 0"),
    CallCase("summarize_recall-empty-row", lambda: recall.summarize_recall([{}]), hp.InvalidInputError,
             "rows[0] is not a row of score_recall: it lacks distance, form, gap"),
    CallCase("summarize_recall-length-below-the-distances", lambda: recall.summarize_recall(recall_rows(), length=100),
             hp.InvalidParameterError, "length=100 is not longer than the rows' longest distance"),
    CallCase("summarize_recall-length-0", lambda: recall.summarize_recall(recall_rows(), length=0),
             hp.InvalidParameterError, "length must be >= 1, got 0"),
    CallCase("score_recall-control-a-str", lambda: recall.score_recall(llama(), sets(), control="no", progress=False),
             hp.ParameterTypeError, "control must be a bool, got 'no'"),
    CallCase("score_recall-not-sets", lambda: recall.score_recall(llama(), [1], progress=False), hp.InvalidInputError,
             "sets[0] must be a RecallSet (make_recall gives them), got 1"),
    CallCase("score_recall-encoder", lambda: recall.score_recall(encoder(), sets(), progress=False),
             hp.UnsupportedModelError, "score_recall: model is a BertForMaskedLM (bert), not a causal LM"),
    CallCase("score_recall-no-model", lambda: recall.score_recall(None, sets(), progress=False), hp.InvalidInputError,
             "score_recall: model must be a transformers causal LM"),
    CallCase("cell_sequences-no-passages", lambda: recall.cell_sequences(512, 0), hp.InvalidParameterError,
             "passages must be >= 1, got 0"),
    CallCase("cell_sequences-length-a-str", lambda: recall.cell_sequences("a", 2), hp.ParameterTypeError,
             "length must be an int, got 'a'"),
    # eval.ruler
    CallCase("make_samples-lengths-an-int", lambda: ruler.make_samples("passkey", tok(), lengths=900),
             hp.ParameterTypeError, "lengths must be a list of ints (token counts), got 900 (int)"),
    CallCase("make_samples-depths-a-float", lambda: ruler.make_samples("passkey", tok(), lengths=[600], depths=0.5),
             hp.ParameterTypeError, "depths must be a list of numbers in [0, 1], got 0.5"),
    CallCase("make_samples-lengths-huge", lambda: ruler.make_samples("passkey", tok(), lengths=[10**7]),
             hp.InvalidParameterError, "lengths[0]=10000000 is past the longest prompt built here, 1048576 tokens"),
    CallCase("make_samples-hops-huge", lambda: ruler.make_samples("vt", tok(), lengths=[600], hops=10**5),
             hp.InvalidParameterError, "hops=100000 makes a chain of 100001 variable lines"),
    CallCase("make_samples-haystack-an-int", lambda: ruler.make_samples("single", tok(), lengths=[600], haystack=5),
             hp.ParameterTypeError, "haystack must be a text (a str), got 5"),
    CallCase("make_samples-seed-a-str", lambda: ruler.make_samples("passkey", tok(), lengths=[600], seed="a"),
             hp.ParameterTypeError, "seed must be an int, got 'a'"),
    CallCase("make_samples-bos-unknown", lambda: ruler.make_samples("passkey", tok(), lengths=[600], bos="x"),
             hp.InvalidParameterError, "bos must be 'auto', True or False, got 'x'"),
    CallCase("score_samples-encoder", lambda: ruler.score_samples(encoder(), samples(), progress=False),
             hp.UnsupportedModelError, "score_samples: model is a BertForMaskedLM (bert), not a causal LM"),
    CallCase("score_samples-past-the-table", lambda: ruler.score_samples(table(), samples(), progress=False),
             hp.SequenceTooLongError, "an input of 544 tokens is longer than this model's learned position table"),
    CallCase("score_samples-not-samples", lambda: ruler.score_samples(llama(), [1], progress=False),
             hp.InvalidInputError, "samples must be a non-empty list of the Samples make_samples gives"),
    CallCase("summarize_samples-empty-row", lambda: ruler.summarize_samples([{}]), hp.InvalidInputError,
             "rows[0] is not a row of score_samples: it lacks correct, family, length"),
    CallCase("summarize_samples-none", lambda: ruler.summarize_samples(None), hp.InvalidInputError,
             "summarize_samples needs the rows of score_samples, got None"),
    CallCase("summarize_samples-no-rows", lambda: ruler.summarize_samples([]), hp.InvalidInputError,
             "summarize_samples needs the rows of score_samples, got []"),
    CallCase("summarize_samples-threshold-past-1", lambda: ruler.summarize_samples(sample_rows(), threshold=1.5),
             hp.InvalidParameterError, "threshold must be <= 1, got 1.5"),
    CallCase("summarize_samples-threshold-negative", lambda: ruler.summarize_samples(sample_rows(), threshold=-0.1),
             hp.InvalidParameterError, "threshold must be >= 0, got -0.1"),
    CallCase("summarize_samples-threshold-a-str", lambda: ruler.summarize_samples(sample_rows(), threshold="a"),
             hp.ParameterTypeError, "threshold must be a number, got 'a'"),
    CallCase("summarize_samples-share-past-1",
             lambda: ruler.summarize_samples(sample_rows(), native=600, share_of_native=1.5),
             hp.InvalidParameterError, "share_of_native must be <= 1, got 1.5"),
    CallCase("summarize_samples-native-alone", lambda: ruler.summarize_samples(sample_rows(), native=600),
             hp.InvalidParameterError, "native and share_of_native go together"),
    CallCase("summarize_samples-share-alone", lambda: ruler.summarize_samples(sample_rows(), share_of_native=0.5),
             hp.InvalidParameterError, "got native=None, share_of_native=0.5"),
    CallCase("summarize_samples-native-not-measured",
             lambda: ruler.summarize_samples(sample_rows(), native=999, share_of_native=0.5),
             hp.InvalidParameterError, "native=999 is not a length measured for passkey (600)"),
    CallCase("summarize_samples-row-of-wrong-types", lambda: ruler.summarize_samples(
        [{"family": "x", "length": "a", "correct": "yes", "logprob": None, "shared": True}]), hp.InvalidInputError,
             "rows[0] is not a row of score_samples: length an int, correct a bool and logprob a number, got 'a'"),
    CallCase("make_samples-a-list-of-families", lambda: ruler.make_samples(["passkey"], tok(), lengths=[600]),
             hp.InvalidParameterError, "unknown retrieval family ['passkey'] (one family a call"),
    # eval.stats
    CallCase("bootstrap-samples-0", lambda: stats.bootstrap_mean([1.0, 2.0], samples=0), hp.InvalidParameterError,
             "samples must be >= 1, got 0"),
    CallCase("bootstrap-samples-a-str", lambda: stats.bootstrap_mean([1.0, 2.0], samples="a"), hp.ParameterTypeError,
             "samples must be an int, got 'a'"),
    CallCase("bootstrap-values-none", lambda: stats.bootstrap_mean(None), hp.InvalidInputError,
             "values must be a list of numbers, got None"),
    CallCase("bootstrap-values-a-str", lambda: stats.bootstrap_mean("abc"), hp.InvalidInputError,
             "values must be a list of numbers, got 'abc'"),
    CallCase("bootstrap-seed-a-str", lambda: stats.bootstrap_mean([1.0, 2.0], seed="a"), hp.ParameterTypeError,
             "seed must be an int, got 'a'"),
    CallCase("paired-none", lambda: stats.paired_difference(None, [1.0]), hp.InvalidInputError,
             "a must be a list of numbers, got None"),
    CallCase("interval_text-empty", lambda: stats.interval_text({}), hp.InvalidInputError,
             "interval_text needs a cell of bootstrap_mean (n, mean, half_width); {} lacks n, mean, half_width"),
    CallCase("interval_text-none", lambda: stats.interval_text(None), hp.InvalidInputError, "None lacks n"),
    CallCase("interval_text-digits-negative", lambda: stats.interval_text(stats.bootstrap_mean([1.0, 2.0]), digits=-1),
             hp.InvalidParameterError, "digits must be >= 0, got -1"),
    CallCase("share_text-empty", lambda: stats.share_text({}), hp.InvalidInputError,
             "share_text needs a cell of wilson (n, found, accuracy, low, high)"),
    CallCase("wilson-z-negative", lambda: stats.wilson(5, 10, z=-1.96), hp.InvalidParameterError,
             "z must be > 0, got -1.96"),
    CallCase("wilson-z-a-str", lambda: stats.wilson(5, 10, z="a"), hp.ParameterTypeError, "z must be a number"),
    CallCase("wilson-found-a-bool", lambda: stats.wilson(True, 10), hp.InvalidInputError,
             "wilson needs whole counts 0 <= found <= n, got found=True"),
    CallCase("effective_length-threshold-a-str", lambda: stats.effective_length({1: 0.5}, "a"), hp.ParameterTypeError,
             "threshold must be a number, got 'a'"),
    CallCase("effective_length-no-scores", lambda: stats.effective_length(None, 0.5), hp.InvalidInputError,
             "scores must map each length to its score (a number), got None"),
    CallCase("effective_length-threshold-2", lambda: stats.effective_length({1: 0.5}, 2), hp.InvalidParameterError,
             "threshold must be a share in (0, 1)"),
    CallCase("effective_length-threshold-0", lambda: stats.effective_length({1: 0.5}, 0), hp.InvalidParameterError,
             "threshold must be > 0"),
]


@pytest.mark.parametrize("case", CALL_CASES, ids=[c.id for c in CALL_CASES])
def test_bad_input_to_the_python_api_is_refused_in_one_line(case):
    refused_in_one_line(case)


def test_a_refused_score_ran_no_forward(monkeypatch):
    """The checks come before the work: a model refused past its table, or a probe past the vocabulary among
    good ones, never reaches a forward."""
    calls = []
    model = llama()
    monkeypatch.setattr(type(model), "forward", lambda *a, **k: calls.append(1))
    with pytest.raises(hp.InvalidInputError):
        probes.score_probes(model, [([1, 2], [3]), ([1, 2], [9999])])
    with pytest.raises(hp.ParameterTypeError):
        recall.score_recall(model, sets(), control="no", progress=False)
    assert not calls
