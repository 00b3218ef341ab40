"""The RULER task-family contract (hf_posenc/eval/ruler.py's FAMILIES; docs/ARCHITECTURE.md, "RULER task
families"), run on every registered family, the shipped ones and the worked example tests/examples/uuid_task.py
(registered for the tests only), with nothing to write: samples of the documented shape (one per length and index,
each probe's prompt + answer within a line of its length, tokens that decode and encode back to themselves, every
word of the answer in the prompt, depth and distance in range), the same from one seed and others from another;
`reads` as declared (each of depths, needles, hops changes the samples exactly when the family says it reads it);
a noise family needs no text and the others refuse none; a length too short refused in one line; scores exact
against a scorer written here (a full forward a probe); the evaluate recipe takes its name, lets go the settings it
does not read and, for the example, measures it; a family of hf_posenc is named by eval.tasks' help and by
docs/evaluate.md's table, with what it reads. make_samples itself refuses, naming the family, content that breaks
the contract (no needle or probe, a needle line without its newline, an answer the needle lines do not hold, a draw
the seed does not give). One family: `pytest -m contract -k my_family tests/test_task_contract.py`."""

from __future__ import annotations

import dataclasses
import random
import re
from pathlib import Path

import pytest
import torch
from test_eval_recipe import checkpoint, corpus_dir, recipe  # noqa: F401  (fixtures)
from tiny import TINY_TEXT_VOCAB, tiny_model, tiny_tokenizer

from hf_posenc.errors import ConfigError, InvalidInputError, InvalidParameterError
from hf_posenc.eval import ruler
from hf_posenc.eval.retrieval import FILLER
from hf_posenc.recipes import evaluate_config

pytestmark = pytest.mark.usefixtures("one_thread")

ROOT = Path(__file__).resolve().parent.parent
NAMES = list(ruler.TASKS)
# the families an installed hf_posenc has (the worked example is registered by the tests only)
SHIPPED = [name for name, cls in ruler.TASKS.items() if cls.__module__.startswith("hf_posenc.")]
SETTINGS = {"depths": ((0.2,), (0.8,)), "needles": (2, 3), "hops": (2, 3)}   # make_samples' keyword: two values
PROSE = "".join(f"Verse {i}: and the {random.Random(i).choice(['lamb', 'lion', 'dove', 'vine'])} went unto "
                f"{random.Random(i + 99).randint(100, 999)} hills by the river.\n" for i in range(400))
LINE = max(len(line) + 1 for line in [*PROSE.splitlines(), FILLER])   # a byte tokenizer: a token a character


def samples(name, lengths=(900, 1100), seed=0, **kw):
    return ruler.make_samples(name, tiny_tokenizer(), lengths=list(lengths), samples=2, haystack=PROSE, seed=seed,
                              **kw)


def test_the_worked_example_is_registered_for_the_tests_only():
    assert ruler.TASKS["uuid"].__module__ == "examples.uuid_task" and "uuid" not in SHIPPED
    assert set(SHIPPED) >= {"passkey", "single", "multikey", "multivalue", "multiquery", "vt"}


# --------------------------------------------------------------------------- the family contract: every family
@pytest.mark.contract
@pytest.mark.parametrize("name", NAMES)
def test_a_family_says_what_it_is(name):
    cls = ruler.TASKS[name]
    assert cls.name == name and cls.ruler and cls.summary and cls.__doc__, f"{name}: name, ruler, summary, docstring"
    assert set(cls.reads) <= set(SETTINGS) and isinstance(cls.noise, bool), (cls.reads, cls.noise)


@pytest.mark.contract
@pytest.mark.parametrize("name", NAMES)
def test_samples_have_the_documented_shape(name):
    tok = tiny_tokenizer()
    made = samples(name)
    assert [(s.family, s.length, s.index) for s in made] == [(name, n, i) for n in (900, 1100) for i in range(2)]
    for sample in made:
        assert sample.probes
        longest = max(len(p.prompt) + len(p.answer) for p in sample.probes)
        assert sample.length - LINE < longest <= sample.length    # as many whole lines as fit
        for p in sample.probes:
            full = p.prompt + p.answer
            assert tok(tok.decode(full), add_special_tokens=False)["input_ids"] == full   # canonical tokens
            answer, prompt = tok.decode(p.answer), tok.decode(p.prompt)
            assert answer.startswith(" ") and answer.strip(), answer
            missing = [w for w in re.split(r"[\s,]+", answer.strip()) if w not in prompt]
            assert not missing, f"{name}: the answer's {missing} are not in the prompt"
            assert 0 <= p.depth <= 1 and 0 < p.distance < len(p.prompt)
    assert made == samples(name) and made != samples(name, seed=1)   # from the seed alone


@pytest.mark.contract
@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("setting", list(SETTINGS))
def test_the_settings_it_reads_are_the_ones_it_declares(name, setting):
    base = {key: values[0] for key, values in SETTINGS.items()}
    changed = samples(name, **base) != samples(name, **{**base, setting: SETTINGS[setting][1]})
    reads = setting in ruler.TASKS[name].reads
    assert changed == reads, f"{name} {'declares' if reads else 'does not declare'} reading {setting}, but its " \
                             f"samples {'do not change' if reads else 'change'} with it"


@pytest.mark.contract
@pytest.mark.parametrize("name", NAMES)
def test_a_noise_family_needs_no_text_and_the_others_refuse_none(name):
    call = lambda: ruler.make_samples(name, tiny_tokenizer(), lengths=[900], samples=1, haystack=None)  # noqa: E731
    if ruler.TASKS[name].noise:
        assert call()
    else:
        with pytest.raises(InvalidInputError):
            call()


@pytest.mark.contract
@pytest.mark.parametrize("name", NAMES)
def test_a_length_too_short_is_refused_in_one_line(name):
    with pytest.raises(InvalidParameterError) as caught:
        samples(name, lengths=(20,))
    assert f"too short for a {name} sample" in str(caught.value) and "\n" not in str(caught.value)


@pytest.mark.contract
@pytest.mark.parametrize("name", NAMES)
def test_the_scores_are_those_of_a_full_forward_a_probe(name):
    model = tiny_model(vocab_size=TINY_TEXT_VOCAB, max_position_embeddings=1024)
    made = samples(name, lengths=(900,))
    rows = ruler.score_samples(model, made, progress=False)
    probes = [(s, p) for s in made for p in s.probes]
    assert len(rows) == len(probes)
    for row, (sample, p) in zip(rows, probes):
        with torch.no_grad():
            logits = model(torch.tensor([p.prompt + p.answer])).logits[0, len(p.prompt) - 1:-1].float()
        answer = torch.tensor(p.answer)
        expected = logits.log_softmax(-1).gather(-1, answer[:, None]).sum().item()
        assert (row["family"], row["length"], row["sample"], row["depth"], row["distance"]) == (
            name, sample.length, sample.index, p.depth, p.distance)
        assert row["correct"] == bool((logits.argmax(-1) == answer).all())
        assert row["logprob"] == pytest.approx(expected, abs=1e-4)


@pytest.mark.contract
@pytest.mark.parametrize("name", NAMES)
def test_the_recipe_takes_its_name_and_lets_go_what_it_does_not_read(name):
    def need(ok, message):
        if not ok:
            raise ConfigError(message)

    ev = evaluate_config.EvalArgs(tasks=[name], task_lengths=[700])
    evaluate_config.check_recall_and_tasks(ev, need)
    unread = recipe.unread(dataclasses.asdict(ev))
    reads = ruler.TASKS[name].reads
    assert {setting for setting, field in (("depths", "depths"), ("needles", "task_needles"), ("hops", "task_hops"))
            if field not in unread} == set(reads)


def test_the_recipe_measures_a_family_it_never_names(checkpoint, corpus_dir, tmp_path):  # noqa: F811
    """The worked example, registered by the tests only, through the evaluate recipe."""
    results = recipe.main(["--model.name", str(checkpoint), "--model.dtype", "float32", "--data.corpus",
                           str(corpus_dir), "--output_dir", str(tmp_path), "--eval.variants", "none",
                           "--eval.max_position_embeddings", "512", "--eval.tasks", "uuid", "--eval.task_lengths",
                           "600", "--eval.task_samples", "2"])
    cell = results["variants"]["none"]["tasks"]["uuid"]["cells"][600]
    assert cell["n"] == 2 and cell["low"] <= cell["accuracy"] <= cell["high"]
    assert "uuid" in (tmp_path / "summary.md").read_text()


@pytest.mark.contract
@pytest.mark.parametrize("name", SHIPPED)
def test_the_help_and_the_docs_name_every_shipped_family(name):
    help_text = evaluate_config.EvalArgs.__dataclass_fields__["tasks"].metadata["help"]
    assert re.search(rf"\b{name}\b", help_text), f"eval.tasks' help (recipes/evaluate.py) omits {name}"
    rows = docs_rows()
    assert name in rows, f"docs/evaluate.md's table of families has no row for {name}"
    assert rows[name] == set(ruler.TASKS[name].reads), (
        f"docs/evaluate.md says {name} reads {sorted(rows[name])}; it declares {sorted(ruler.TASKS[name].reads)}")


def docs_rows() -> dict[str, set[str]]:
    """docs/evaluate.md's table of families: name -> the settings its last column says it reads."""
    text = (ROOT / "docs/evaluate.md").read_text()
    table = text[text.index("| family | RULER's task |"):]
    rows = re.findall(r"^\| `(\w+)` \|.*\| ([^|]*) \|$", table[:table.index("\n\n")], re.M)
    return {name: set(re.findall(r"`(\w+)`", reads)) for name, reads in rows}


def test_the_docs_table_names_only_registered_families():
    assert sorted(docs_rows()) == sorted(SHIPPED)


# ------------------------------------------------------------------------------------------ the registry
def test_register_task_refuses_a_taken_name_naming_both_classes():
    class Vt(ruler.TaskFamily):
        name = "vt"

    with pytest.raises(InvalidParameterError, match=r"'vt' is registered twice: hf_posenc.eval.ruler."
                                                    r"VariableTracking and test_task_contract.*Vt"):
        ruler.register_task(Vt)
    with pytest.raises(InvalidParameterError, match="register_task takes a TaskFamily subclass"):
        ruler.register_task(dict)
    Vt.name = "Not A Name"
    with pytest.raises(InvalidParameterError, match="needs its own name, a lowercase word"):
        ruler.register_task(Vt)
    assert ruler.TASKS["vt"] is ruler.VariableTracking


def test_an_unknown_family_is_refused_naming_the_registered_ones():
    with pytest.raises(InvalidParameterError, match="unknown task family 'nope'; known: passkey, single, "):
        samples("nope")


NEEDLE = "One of the special magic numbers for x is: 5.\n"


def unseeded(rng):
    """A needle and its answer drawn from the random module, not from `rng`: the seed does not give the sample."""
    value = random.randint(10**8, 10**9)
    return [f"x is {value}.\n"], [("What is x?", f" {value}")]


@pytest.mark.parametrize("content, says", [
    (lambda rng: ([NEEDLE], [("What is x?", "")]), "gave no probe to ask"),
    (lambda rng: ([NEEDLE], []), "gave no probe to ask"),
    (lambda rng: ([], [("What is x?", " 5")]), "gave no needle to hide"),
    (lambda rng: None, "must return (needle lines, [(question, answer), ...])"),
    # what make_samples took without a word: a needle glued to the next haystack line, a probe whose answer the
    # context does not hold, a sample the seed does not give
    (lambda rng: ([NEEDLE.strip()], [("What is x?", " 5")]),
     "gave needle line 0 'One of the special magic numbers for x is: 5.' without a newline at its end"),
    (lambda rng: ([NEEDLE, "VAR A = 12.\n"], [("What is x and A?", " 5, 13")]),
     "gave the answer ' 5, 13', but '13' of it is in none of its needle lines"),
    (unseeded, "drew another sample from the same state of rng: it must draw from the rng it is given alone"),
], ids=["empty-answer", "no-probe", "no-needle", "none", "no-newline", "answer-not-hidden", "unseeded"])
def test_a_registered_family_whose_content_cannot_make_a_sample_is_refused_naming_it(monkeypatch, content, says):
    """An empty answer ended in a StopIteration, no needles or None in an IndexError / TypeError; a needle without
    its newline, an answer the needles do not hold and a draw the seed does not give made samples without a word."""
    class Broken(ruler.TaskFamily):
        name = "broken"
        reads = ("depths",)

        def content(self, rng, needles, hops):
            return content(rng)

    monkeypatch.setitem(ruler.TASKS, "broken", Broken)
    with pytest.raises(InvalidInputError, match=rf"task family 'broken' \(.*Broken\)\.content {re.escape(says)}"):
        ruler.make_samples("broken", tiny_tokenizer(), lengths=[600], samples=1, haystack=FILLER * 200)
