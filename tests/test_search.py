"""The factor search (hf_posenc/search/) and its recipe (hf_posenc/recipes/search.py) on tiny models: the form
holds LongRoPE's constraints and its seeds, the seeds are the closed forms transformers computes, a candidate is
the longrope patch it says, a killed search resumes to the same candidates, bad input is refused before loading,
and the best candidate saves as a checkpoint stock transformers loads with the same logits."""

import json
import math
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

import hf_posenc as hp
from hf_posenc import search
from hf_posenc.errors import ConfigError, InvalidInputError, InvalidParameterError
from hf_posenc.recipes import search as recipe
from hf_posenc.user_input import UsageError
from refusals import one_line_refusal
from tiny import TINY_TEXT_VOCAB, checkpoint, tiny_model, tiny_tokenizer, token_ids  # noqa: F401 (fixtures)

TARGET, ORIGINAL = 256, 64


def settings(**overrides) -> search.SearchSettings:
    values = dict(model="tiny", target=TARGET, original=ORIGINAL, budget=3, passages=4, passage_tokens=16,
                  guard_length=32, guard_share=1.0, population=4)
    return search.SearchSettings(**{**values, **overrides})


def text_ids(n: int = 4000) -> list[int]:
    return token_ids(n, vocab=256, seed=1)[0].tolist()


@pytest.mark.parametrize("attention", [(1.0, 1.3), None])
def test_every_point_holds_longropes_constraints(attention):
    space = search.FactorSpace(pairs=16, factor=4.0, original=ORIGINAL, attention_range=attention)
    rng = np.random.default_rng(0)
    low, high = space.tops
    for x in [np.zeros(space.dims), np.ones(space.dims), *rng.random((300, space.dims))]:
        factors, a = space.point(x)
        assert len(factors) == 16 and min(factors) >= 1 and max(factors) <= high + 1e-6
        assert all(b >= f for f, b in zip(factors, factors[1:])), factors   # non-decreasing toward slow pairs
        assert (a is None) == (attention is None) and (a is None or attention[0] <= a <= attention[1])


def test_the_form_holds_pi_and_ntk_exactly_and_fits_the_others_closely():
    space = search.FactorSpace(pairs=16, factor=4.0, original=ORIGINAL)
    ntk = [4.0 ** (i / 15) for i in range(16)]
    for exact in ([4.0] * 16, ntk):
        fitted, _ = space.point(space.fit(exact, 1.0))
        assert np.allclose(fitted, exact, rtol=2e-3), (fitted, exact)
    space = search.FactorSpace(pairs=8, factor=4.0, original=ORIGINAL)   # the tiny model's rotary pairs
    for name, factors, attention in search.closed_forms(tiny_model(), TARGET):
        fitted, a = space.point(space.fit(factors, attention))
        assert np.abs(np.log(fitted) - np.log(factors)).max() < 0.25, name
        assert a == pytest.approx(min(max(attention, 1.0), 1.3), abs=0.02), name


def test_seeds_are_the_closed_forms_transformers_computes():
    model = tiny_model()
    text = model.config.get_text_config()
    base = 1.0 / (text.rope_parameters["rope_theta"] ** (torch.arange(0, 16, 2).double() / 16))
    seeds = {name: (f, a) for name, f, a in search.closed_forms(model, TARGET)}
    assert seeds["linear"] == ([4.0] * 8, 1.0)
    assert np.allclose(seeds["ntk"][0], [4.0 ** (i / 7) for i in range(8)], rtol=1e-4)
    with hp.patched(model, "yarn", max_position_embeddings=TARGET):
        inv, scale = ROPE_INIT_FUNCTIONS["yarn"](model.config.get_text_config(), "cpu")
    assert np.allclose(seeds["yarn"][0], (base / inv.double()).clamp(min=1).tolist(), rtol=1e-5)
    assert seeds["yarn"][1] == pytest.approx(scale) == pytest.approx(0.1 * math.log(4) + 1)


def test_a_seed_as_longrope_is_its_method_past_the_original_context():
    """YaRN's factors and attention factor as a switched longrope patch: YaRN's logits on a sequence past the
    original context (where the long set applies), the unpatched model's frequencies inside it."""
    model = tiny_model()
    name, factors, attention = next(s for s in search.closed_forms(model, TARGET) if s[0] == "yarn")
    ids = token_ids(200)
    with hp.patched(model, "yarn", max_position_embeddings=TARGET):
        want = model(ids).logits
    with hp.patched(model, "longrope", **search.longrope_params(factors, attention, "switched", TARGET)):
        got = model(ids).logits
    torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-4)
    short = token_ids(ORIGINAL)
    unpatched = model(short).logits
    with hp.patched(model, "longrope", **search.longrope_params(factors, 1.0, "switched", TARGET)):
        assert torch.equal(model(short).logits, unpatched)       # short factors 1, attention 1: bit for bit
    with hp.patched(model, "longrope", **search.longrope_params(factors, 1.0, "static", TARGET)):
        assert not torch.allclose(model(short).logits, unpatched)   # static: the long set everywhere


def test_search_records_every_candidate_and_resumes_after_a_kill(tmp_path):
    model, tok = tiny_model(vocab_size=TINY_TEXT_VOCAB), tiny_tokenizer()
    s = settings(budget=5)
    best = search.FactorSearch(model, tok, text_ids(), s, tmp_path / "a", progress=False).run()
    rows = search.read_candidates(tmp_path / "a" / "candidates.jsonl")
    assert [r["kind"] for r in rows] == [f"seed:{search.SEED_NAMES[n]}" for n in search.SEEDS] + [f"cma:{i}" for i in range(1, 6)]
    assert best == min(rows, key=lambda r: r["value"])
    first = rows[0]
    assert first["n"] == len(first["losses"]) >= 1 and first["low"] <= first["loss"] <= first["high"]
    assert all(d >= ORIGINAL for d in first["distances"])                  # the far passages only
    assert all(r["distances"] == first["distances"] for r in rows)         # all on the same passages: paired
    # killed while writing candidate 6 (in CMA-ES's first generation of 4): its line half there. The rerun
    # replays 5 and scores 6 to 9 again, and only them, to the same candidates.
    path = tmp_path / "a" / "candidates.jsonl"
    lines = path.read_text().splitlines()
    path.write_text("\n".join(lines[:6]) + "\n" + lines[6][:40])
    calls = []
    runner = search.FactorSearch(model, tok, text_ids(), s, tmp_path / "a", progress=False)
    evaluate = runner.evaluate
    runner.evaluate = lambda index, *a, **k: calls.append(index) or evaluate(index, *a, **k)
    runner.run()
    assert calls == [6, 7, 8, 9]
    again = search.read_candidates(path)
    assert [r["long_factor"] for r in again] == [r["long_factor"] for r in rows]
    assert [r["value"] for r in again] == pytest.approx([r["value"] for r in rows], abs=1e-6)
    # a larger budget goes further from where it stopped, the same search
    calls.clear()
    runner = search.FactorSearch(model, tok, text_ids(), settings(budget=7), tmp_path / "a", progress=False)
    evaluate = runner.evaluate
    runner.evaluate = lambda index, *a, **k: calls.append(index) or evaluate(index, *a, **k)
    runner.run()
    assert calls == [10, 11] and search.read_candidates(path)[:10] == again


def test_a_rerun_with_other_settings_is_refused_naming_each_field(tmp_path):
    model, tok = tiny_model(vocab_size=TINY_TEXT_VOCAB), tiny_tokenizer()
    search.FactorSearch(model, tok, text_ids(), settings(budget=0), tmp_path, progress=False).run()
    with pytest.raises(ConfigError, match=r"mode: \"switched\" there, \"static\" now; seed: 0 there, 1 now"):
        search.FactorSearch(model, tok, text_ids(), settings(budget=0, mode="static", seed=1), tmp_path,
                            progress=False).run()


def test_a_resume_on_another_text_or_other_weights_is_refused_naming_it(tmp_path):
    """The same settings, the corpus edited in place (same length) or other weights: refused, not mixed."""
    model, tok = tiny_model(vocab_size=TINY_TEXT_VOCAB), tiny_tokenizer()
    search.FactorSearch(model, tok, text_ids(), settings(budget=0), tmp_path, progress=False).run()
    edited = list(text_ids())
    edited[-1] = (edited[-1] + 1) % TINY_TEXT_VOCAB   # one token past every passage: only the identity sees it
    with pytest.raises(ConfigError, match="other text: the tuning text's token ids"):
        search.FactorSearch(model, tok, edited, settings(budget=1), tmp_path, progress=False).run()
    other = tiny_model(vocab_size=TINY_TEXT_VOCAB, seed=1)
    with pytest.raises(ConfigError, match="other weights"):
        search.FactorSearch(other, tok, text_ids(), settings(budget=1), tmp_path, progress=False).run()
    assert len(search.read_candidates(tmp_path / "candidates.jsonl")) == len(search.SEEDS)   # nothing added


@pytest.mark.parametrize("junk,message", [
    ("null", "line 2 is not a candidate"), ("5", "line 2 is not a candidate"), ("[]", "line 2 is not a candidate"),
    ('{"index": 1}', "no kind, long_factor"), ("\x00\xff binary", "line 2 is not JSON"),
])
def test_a_hand_edited_candidates_file_is_refused_naming_the_line(tmp_path, junk, message):
    model, tok = tiny_model(vocab_size=TINY_TEXT_VOCAB), tiny_tokenizer()
    search.FactorSearch(model, tok, text_ids(), settings(budget=0), tmp_path, progress=False).run()
    path = tmp_path / "candidates.jsonl"
    lines = path.read_text().splitlines()
    path.write_text("\n".join([lines[0], junk, *lines[2:]]) + "\n")
    before = path.read_bytes()
    with pytest.raises(InvalidInputError, match=message):
        search.FactorSearch(model, tok, text_ids(), settings(budget=1), tmp_path, progress=False).run()
    assert path.read_bytes() == before
    with pytest.raises(InvalidInputError, match="is not a file"):
        search.read_candidates(tmp_path)


@pytest.mark.parametrize("part", ["weights", "settings"])
def test_candidates_copied_from_another_search_are_refused_on_resume_naming_what_differs(tmp_path, part):
    """Every line carries the identity of the search that scored it: a candidates.jsonl of the same settings and
    text scored on other weights (the seeds' factors are the same) was replayed, and the best differed."""
    model, tok = tiny_model(vocab_size=TINY_TEXT_VOCAB), tiny_tokenizer()
    other = tiny_model(vocab_size=TINY_TEXT_VOCAB, seed=1) if part == "weights" else model
    search.FactorSearch(model, tok, text_ids(), settings(budget=0), tmp_path / "a", progress=False).run()
    search.FactorSearch(other, tok, text_ids(), settings(budget=0, seed=0 if part == "weights" else 1), tmp_path / "b",
                        progress=False).run()
    path = tmp_path / "a" / "candidates.jsonl"
    shutil.copy(tmp_path / "b" / "candidates.jsonl", path)
    before = path.read_bytes()
    with pytest.raises(InvalidInputError, match=rf"{path} line 1 was scored by another search, of other {part} "
                                                rf"\({part} sha256 \w{{12}} there, \w{{12}} now\).*fresh output folder"):
        search.FactorSearch(model, tok, text_ids(), settings(budget=1), tmp_path / "a", progress=False).run()
    assert path.read_bytes() == before


def test_a_search_record_without_its_identity_is_refused_not_trusted(tmp_path):
    """search.json that lost its identity (the hashes of its text and weights) resumed on a text edited in place:
    refused, on any text, saying how to start over."""
    model, tok = tiny_model(vocab_size=TINY_TEXT_VOCAB), tiny_tokenizer()
    search.FactorSearch(model, tok, text_ids(), settings(budget=0), tmp_path, progress=False).run()
    record = json.loads((tmp_path / "search.json").read_text())
    del record["identity"]
    (tmp_path / "search.json").write_text(json.dumps(record))
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    edited = list(text_ids())
    edited[-1] = (edited[-1] + 1) % TINY_TEXT_VOCAB   # one token past every passage: only the identity sees it
    for ids in (edited, text_ids()):
        with pytest.raises(InvalidInputError, match=r"search.json has no identity \(the sha256 of the text and of "
                                                    r"the weights.*start over in a fresh output folder"):
            search.FactorSearch(model, tok, ids, settings(budget=1), tmp_path, progress=False).run()
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before


def test_a_candidate_a_factor_short_is_refused_naming_the_line_and_both_counts(tmp_path):
    """It ended in numpy's "operands could not be broadcast together" once the search replayed it."""
    model, tok = tiny_model(vocab_size=TINY_TEXT_VOCAB), tiny_tokenizer()
    search.FactorSearch(model, tok, text_ids(), settings(budget=0), tmp_path, progress=False).run()
    path = tmp_path / "candidates.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    rows[2]["long_factor"] = rows[2]["long_factor"][:-1]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(InvalidInputError, match=rf"{path} line 3 has 7 factors in long_factor, where the search's "
                                                rf"model has 8 rotary pairs"):
        search.FactorSearch(model, tok, text_ids(), settings(budget=1), tmp_path, progress=False).run()


RESULTS = Path(__file__).resolve().parent.parent / "benchmarks" / "results"


@pytest.mark.parametrize("name", ["search_32k_banded", "search_32k_floor"])
def test_the_committed_search_records_read_as_written_but_resume_nothing(name):
    """benchmarks/results/search_32k_* were written before candidates carried their search's identity: their
    figure's and summary's reader reads them as they are, a resume refuses them, bench_search.py --transfer takes
    them only with --unmarked-candidates."""
    folder = RESULTS / name
    record = search.resume_record(folder / "search.json", json.loads((folder / "search.json").read_text())["settings"])
    rows = search.read_candidates(folder / "candidates.jsonl")
    assert len(rows) == len(search.SEEDS) + record["settings"]["budget"] and not any("identity" in r for r in rows)
    with pytest.raises(InvalidInputError, match="line 1 carries no identity.*start over in a fresh output folder"):
        search.read_candidates(folder / "candidates.jsonl", record)
    assert search.read_candidates(folder / "candidates.jsonl", record, unmarked=True) == rows


@pytest.mark.parametrize("junk, message", [
    (b"\x89PNG\r\n\x1a\n\x00\xff\xfe", r"line 6 is not JSON: it holds bytes that are not UTF-8 text"),
    (b"\xff\xfe", r"line 6 is not JSON: it holds bytes that are not UTF-8 text"),   # even cut short, by a kill
    (b'{"index": 5, "kind"\n', r"line 6 is not JSON \(only a last line with no newline"),   # a kill ends no line
])
def test_junk_appended_to_the_candidates_is_refused_naming_the_file_and_line(tmp_path, junk, message):
    """Binary junk past the last candidate ended in a raw UnicodeDecodeError once the search had started."""
    model, tok = tiny_model(vocab_size=TINY_TEXT_VOCAB), tiny_tokenizer()
    search.FactorSearch(model, tok, text_ids(), settings(budget=0), tmp_path, progress=False).run()
    path = tmp_path / "candidates.jsonl"
    path.write_bytes(path.read_bytes() + junk)
    before = path.read_bytes()
    with pytest.raises(InvalidInputError, match=f"{path} {message}"):
        search.FactorSearch(model, tok, text_ids(), settings(budget=1), tmp_path, progress=False).run()
    assert path.read_bytes() == before


@pytest.mark.parametrize("field,value,message", [("seed", -1, "seed"), ("seed", 2**40, "seed"),
                                                 ("top_range", None, "top_range must be")])
def test_settings_out_of_range_are_refused_before_any_pass(field, value, message):
    with pytest.raises(InvalidParameterError, match=message):
        settings(**{field: value})


def test_public_calls_of_the_wrong_kind_are_refused_naming_what_they_need(tmp_path):
    model, tok = tiny_model(), tiny_tokenizer()
    (tmp_path / "file").write_text("x")
    calls = [
        (lambda: search.FactorSearch(model, tok, "a str", settings(), tmp_path / "a"), "token ids"),
        (lambda: search.FactorSearch(model, tok, [0.5] * 4000, settings(), tmp_path / "a"), "token ids"),
        (lambda: search.FactorSearch(model, tok, text_ids(), {"target": TARGET}, tmp_path / "a"), "SearchSettings"),
        (lambda: search.FactorSearch(model, tok, text_ids(), settings(), tmp_path / "file"), "is a file"),
        (lambda: search.FactorSearch(model, tok, text_ids(), settings(original=32, guard_length=16), tmp_path / "a"),
         "not the model's original context 64"),
        (lambda: search.best_method({}, TARGET, ORIGINAL), "no kind, mode, long_factor"),
        (lambda: search.FactorSpace(pairs=8, factor=4.0, original=ORIGINAL).point([0.5, 0.5]), "5 finite numbers"),
    ]
    for call, words in calls:
        with pytest.raises(InvalidInputError, match=words):
            call()
    assert not (tmp_path / "a").exists()   # nothing written on a refusal
    with hp.patched(model, "yarn", factor=2.0):
        with pytest.raises(InvalidInputError, match="already patched"):
            search.FactorSearch(model, tok, text_ids(), settings(), tmp_path / "a")
    torch_ids = torch.tensor(text_ids())   # a tensor of ids is token ids too
    assert search.FactorSearch(model, tok, torch_ids, settings(), tmp_path / "a", progress=False).pairs == 8


def test_the_guard_rejects_before_the_long_pass_and_ranks_rejections_last(tmp_path):
    model, tok = tiny_model(vocab_size=TINY_TEXT_VOCAB), tiny_tokenizer()
    s = settings(budget=3, guard_share=0.0, attention_range=[1.0, 1.3], mode="switched")
    runner = search.FactorSearch(model, tok, text_ids(), s, tmp_path, progress=False)
    # a guard that rises with the attention factor (a random tiny model's perplexity may fall with it)
    runner.guard_perplexity = lambda: 10 * float(search.rotary_module(model).attention_scaling)
    passes = []
    fitness = runner.fitness
    runner.fitness = lambda *a: passes.append(1) or fitness(*a)
    runner.run()
    rows = search.read_candidates(tmp_path / "candidates.jsonl")
    rejected = [r for r in rows if r["rejected"]]
    assert rejected and all(r["guard_rise"] > 0 and r["value"] > search.REJECTED for r in rejected)
    assert len(passes) == len(rows) - len(rejected)   # a rejected candidate costs no recall pass
    assert {r["kind"] for r in rejected} >= {"seed:YaRN", "seed:ramp"}   # their attention factor changes 2k


@pytest.mark.parametrize("overrides, words", [
    ({"target": 64}, "must be longer than the model's original context 64"),
    ({"top_range": [2.0, 1.0]}, "top_range is inverted"),
    ({"top_range": [0.01, 0.1]}, "every factor must be >= 1"),
    ({"attention_range": [0.5, 1.0]}, "attention_range low must be >= 1"),
    ({"guard_length": 65}, "guard_length must be <= 64"),
    ({"mode": "dynamic"}, "mode must be one of switched, static"),
    ({"far_from": 255, "passages": 2}, "no passage of a 256-token sequence lies that far back"),
    ({"guard_share": -0.1}, "guard_share must be >= 0"),
    ({"population": 2}, "population must be 0"),
])
def test_settings_refuse_a_search_space_that_cannot_be_expressed(overrides, words):
    with pytest.raises(InvalidParameterError, match=words):
        settings(**overrides)


# -- the recipe ------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    path = tmp_path_factory.mktemp("corpus") / "text.txt"
    path.write_text("".join(f"Line {i}: the {['king', 'queen', 'fool'][i % 3]} speaks of {i * 7 % 13} ravens.\n"
                            for i in range(200)))
    return path


def recipe_args(checkpoint, corpus, out, *extra) -> list[str]:
    return ["--model.name", str(checkpoint), "--model.dtype", "float32", "--data.corpus", str(corpus),
            "--output_dir", str(out), "--search.target", str(TARGET), "--search.budget", "2", "--search.passages",
            "4", "--search.passage_tokens", "16", "--search.guard_length", "32", "--search.guard_share", "1",
            "--search.population", "4", *extra]


def test_recipe_saves_the_best_as_a_stock_checkpoint_with_the_same_logits(checkpoint, corpus, tmp_path):
    best = recipe.main(recipe_args(checkpoint, corpus, tmp_path))
    for name in ("search.json", "candidates.jsonl", "summary.md", "convergence.png"):
        assert (tmp_path / name).stat().st_size > 0
    assert best["kind"] in (tmp_path / "summary.md").read_text()
    stock = AutoModelForCausalLM.from_pretrained(tmp_path / "best").eval()
    params = stock.config.rope_parameters
    assert params["rope_type"] == "longrope" and params["long_factor"] == best["long_factor"]
    assert params["short_factor"] == [1.0] * len(best["long_factor"])
    model = hp.load_model(str(checkpoint))
    ids = token_ids(200, vocab=TINY_TEXT_VOCAB)
    with hp.patched(model, "longrope", **search.longrope_params(best["long_factor"], best["attention_factor"],
                                                                 "switched", TARGET)):
        want = model(ids).logits
    torch.testing.assert_close(stock(ids).logits, want)


def refusal(capsys, argv) -> str:
    return one_line_refusal(capsys, recipe.main, argv)


def test_recipe_refuses_bad_input_before_the_model_loads(checkpoint, corpus, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(hp, "load_model", lambda *a, **k: pytest.fail("the model loaded"))
    out = tmp_path / "out"
    base = recipe_args(checkpoint, corpus, out)
    assert "must be longer than the model's original context 64" in refusal(capsys, [*base, "--search.target", "64"])
    assert "top_range is inverted" in refusal(capsys, [*base, "--search.top_range", "[3, 1]"])
    assert "search.top_range must be [low, high]" in refusal(capsys, [*base, "--search.top_range", "[3]"])
    assert "every factor must be >= 1" in refusal(capsys, [*base, "--search.top_range", "[0.01, 0.1]"])
    assert "need" in refusal(capsys, [*base, "--search.passages", "4", "--search.target", "65536",
                                      "--search.guard_length", "32"])   # a text too short for its passages
    gpt2 = tmp_path / "gpt2"
    tiny_model("gpt2", vocab_size=TINY_TEXT_VOCAB).save_pretrained(gpt2)
    assert "longrope" in refusal(capsys, recipe_args(gpt2, corpus, out))   # a learned table: no rotary pairs
    assert not out.exists()
    # the same folder with other settings: each field named, nothing changed
    out.mkdir()
    (out / "search.json").write_text(json.dumps({"settings": {"mode": "static"}, "passages": [],
                                                 "unpatched_guard_perplexity": 3.0}))
    assert "mode: \"static\" there, \"switched\" now" in refusal(capsys, base)
    assert sorted(p.name for p in out.iterdir()) == ["search.json"]


def test_recipe_refuses_a_folder_it_would_write_over(finished, checkpoint, corpus, tmp_path, monkeypatch, capsys):
    """A search writes its files into output_dir and replaces best/ whole: a user's folder, or one holding the
    model it reads, was written over (exit 0)."""
    monkeypatch.setattr(hp, "load_model", lambda *a, **k: pytest.fail("the model loaded"))
    mine = tmp_path / "mine"
    (mine / "best").mkdir(parents=True)
    (mine / "best" / "notes.txt").write_text("keep")
    (mine / "summary.md").write_text("keep")
    assert re.search(r"output_dir .*mine holds summary\.md, best but no search of its own \(search\.json\): not a "
                     r"search's folder", refusal(capsys, recipe_args(checkpoint, corpus, mine)))
    (mine / "notes.txt").write_text("keep")
    assert "holds notes.txt but no search" in refusal(capsys, recipe_args(checkpoint, corpus, mine))
    copy = tmp_path / "copy"
    shutil.copytree(finished, copy)
    shutil.copytree(checkpoint, copy / "best", dirs_exist_ok=True)   # the input inside the folder it writes
    assert re.search(r"output_dir .*copy contains the input .*copy/best, which the search could write over",
                     refusal(capsys, recipe_args(copy / "best", corpus, copy)))
    assert (mine / "summary.md").read_text() == "keep" and (mine / "best" / "notes.txt").read_text() == "keep"


@pytest.mark.parametrize("scored", [0, 2])
def test_ctrl_c_says_what_the_search_kept(finished, checkpoint, corpus, tmp_path, monkeypatch, capsys, scored):
    out = tmp_path / "out"
    if scored:
        shutil.copytree(finished, out)
        lines = (out / "candidates.jsonl").read_text().splitlines()[:scored]
        (out / "candidates.jsonl").write_text("".join(f"{line}\n" for line in lines))

    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(recipe, "run", interrupted)
    with pytest.raises(SystemExit) as stop:
        recipe.main(recipe_args(checkpoint, corpus, out))
    said = capsys.readouterr().err.strip()
    assert stop.value.code == 130
    assert said == (f"interrupted: 2 finished candidate(s) kept in {out / 'candidates.jsonl'}; run the same command "
                    f"to go on" if scored else "interrupted before the first candidate was scored: nothing was kept")


def test_kill_9_loses_no_finished_candidate(checkpoint, corpus, tmp_path):
    """A search killed with SIGKILL mid-run keeps every candidate it finished, and the rerun ends where an
    uninterrupted search ends, candidate for candidate."""
    import os
    import signal
    import time

    args = recipe_args(checkpoint, corpus, tmp_path / "killed", "--search.budget", "24", "--search.population", "8",
                       "--plots", "false", "--save", "false")
    child = subprocess.Popen([sys.executable, "-m", "hf_posenc.recipes.search", *args], stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL, env={**os.environ, "OMP_NUM_THREADS": "1"})
    path = tmp_path / "killed" / "candidates.jsonl"
    deadline = time.time() + 120
    while time.time() < deadline and child.poll() is None:
        if path.exists() and len(path.read_text().splitlines()) >= 7:
            break
        time.sleep(0.02)
    child.send_signal(signal.SIGKILL)
    child.wait()
    kept = search.read_candidates(path)
    assert 7 <= len(kept) < 29, len(kept)   # killed mid-search, the finished ones on disk
    recipe.main(args)
    whole = recipe_args(checkpoint, corpus, tmp_path / "whole", "--search.budget", "24", "--search.population", "8",
                        "--plots", "false", "--save", "false")
    recipe.main(whole)
    resumed, straight = search.read_candidates(path), search.read_candidates(tmp_path / "whole" / "candidates.jsonl")
    assert resumed[:len(kept)] == kept
    assert [r["long_factor"] for r in resumed] == [r["long_factor"] for r in straight]
    assert [r["value"] for r in resumed] == pytest.approx([r["value"] for r in straight], abs=1e-6)


def test_a_second_search_in_the_same_folder_is_refused_while_the_first_runs(tmp_path):
    import fcntl

    model, tok = tiny_model(vocab_size=TINY_TEXT_VOCAB), tiny_tokenizer()
    tmp_path.mkdir(exist_ok=True)
    with open(tmp_path / ".lock", "w") as lock:   # what the running search holds
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        with pytest.raises(ConfigError, match="another search is running in"):
            search.FactorSearch(model, tok, text_ids(), settings(budget=0), tmp_path, progress=False).run()
    assert not (tmp_path / "candidates.jsonl").exists()


def leave_a_dead_runs_temporaries(out: Path) -> list[Path]:
    """What a search killed in `out` leaves of its writes: a half-written copy of best/, the old best/ it was
    replacing, the temporary files of search.json, candidates.jsonl and summary.md; and beside them, names that
    are not a search's temporaries."""
    left = [out / ".best.tmp-deadbeef", out / ".best.old-0badc0de"]
    for folder in left:
        folder.mkdir()
        (folder / "model.safetensors").write_bytes(b"half")
    for name in (".search.json.tmp999999", ".candidates.jsonl.tmp999999", ".summary.md.tmp999999"):
        (out / name).write_text("half")
        left.append(out / name)
    for other in (out / ".bestiary.tmp-1", out / "notes.txt"):
        other.write_text("mine")
    return left


def test_a_search_removes_what_a_killed_one_left_in_its_folder_and_nothing_else(finished, checkpoint, corpus,
                                                                               tmp_path):
    """A search killed while writing best/ left its partial model copy for good: the next run in the folder removes
    every temporary of a search's writes before it starts, leaving only what a resume reads and what it writes."""
    out = tmp_path / "out"
    shutil.copytree(finished, out)
    left = leave_a_dead_runs_temporaries(out)
    recipe.main(recipe_args(checkpoint, corpus, out, "--plots", "false"))
    assert not any(p.exists() for p in left)
    assert sorted(p.name for p in out.iterdir()) == [".bestiary.tmp-1", ".lock", "best", "candidates.jsonl",
                                                     "notes.txt", "search.json", "summary.md"]
    assert (out / "best" / "config.json").is_file()


def test_a_search_refused_while_another_runs_in_its_folder_removes_nothing(finished, tmp_path):
    """The temporaries in a folder where a search runs are its own, being written: only the search that holds the
    folder's lock removes any."""
    import fcntl

    shutil.copytree(finished, tmp_path / "out")
    left = leave_a_dead_runs_temporaries(tmp_path / "out")
    model, tok = tiny_model(vocab_size=TINY_TEXT_VOCAB), tiny_tokenizer()
    with open(tmp_path / "out" / ".lock", "w") as lock:   # what the running search holds
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        with pytest.raises(ConfigError, match="another search is running in"):
            search.FactorSearch(model, tok, text_ids(), settings(budget=0), tmp_path / "out", progress=False).run()
    assert all(p.exists() for p in left)


def test_a_search_killed_while_saving_best_leaves_nothing_the_next_run_keeps(checkpoint, corpus, tmp_path):
    """SIGKILL while best/ is half written: its temporary folder stays until the next run in the folder, which
    removes it and saves best/ whole."""
    import os
    import signal
    import time

    args = recipe_args(checkpoint, corpus, tmp_path / "out", "--search.budget", "0", "--plots", "false")
    slow_save = ("import sys, time; from transformers import PreTrainedModel; save = PreTrainedModel.save_pretrained; "
                 "PreTrainedModel.save_pretrained = lambda self, path, *a, **k: (save(self, path, *a, **k), "
                 "print('saved', flush=True), time.sleep(600)); from hf_posenc.recipes import search; "
                 "search.main(sys.argv[1:])")
    child = subprocess.Popen([sys.executable, "-c", slow_save, *args], stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        assert child.stdout.readline() == "saved\n"   # the model's files written, the tokenizer's not yet
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    partial = list((tmp_path / "out").glob(".best.tmp-*"))
    assert len(partial) == 1 and (partial[0] / "config.json").is_file() and not (tmp_path / "out" / "best").exists()
    recipe.main(args)
    assert not partial[0].exists() and not list((tmp_path / "out").glob(".best.*"))
    assert (tmp_path / "out" / "best" / "tokenizer_config.json").is_file()


def test_a_switched_search_whose_fixed_attention_fails_the_guard_is_refused_before_any_long_pass(tmp_path):
    model, tok = tiny_model(vocab_size=TINY_TEXT_VOCAB), tiny_tokenizer()
    runner = search.FactorSearch(model, tok, text_ids(), settings(attention_range=None, guard_share=0.0), tmp_path,
                                 progress=False)
    runner.guard_perplexity = lambda: 10 * float(search.rotary_module(model).attention_scaling)
    runner.fitness = lambda: pytest.fail("a long pass ran")
    with pytest.raises(ConfigError, match=r"longrope's default attention factor 1\.155, which raises the guard"):
        runner.run()


def test_the_best_is_saved_as_its_own_method_where_it_is_one():
    """A static search whose best is the YaRN (llama3) seed with YaRN's (llama3's) attention factor saves yarn
    (llama3): the same model at every length; anything else saves longrope with its factors and mode."""
    row = {"kind": "seed:YaRN", "mode": "static", "attention_factor": 0.1 * math.log(4) + 1, "long_factor": [2.0] * 8}
    assert search.best_method(row, TARGET, ORIGINAL) == ("yarn", {"max_position_embeddings": TARGET})
    assert search.best_method({**row, "kind": "seed:llama3", "attention_factor": 1.0}, TARGET, ORIGINAL)[0] == "llama3"
    for other in ({"mode": "switched"}, {"attention_factor": 1.05}, {"kind": "cma:3"}):
        method, params = search.best_method({**row, **other}, TARGET, ORIGINAL)
        assert method == "longrope" and params["long_factor"] == [2.0] * 8
    model = tiny_model()
    name, factors, attention = next(s for s in search.closed_forms(model, TARGET) if s[0] == "yarn")
    ids = token_ids(200)
    with hp.patched(model, *search.best_method({**row, "long_factor": factors}, TARGET, ORIGINAL)[:1],
                    max_position_embeddings=TARGET):
        want = model(ids).logits
    with hp.patched(model, "longrope", **search.longrope_params(factors, attention, "static", TARGET)):
        torch.testing.assert_close(model(ids).logits, want, atol=2e-5, rtol=1e-4)   # the seed is its method


def test_a_search_in_bfloat16_saves_the_stored_weights_not_its_rounded_copy(checkpoint, corpus, tmp_path):
    recipe.main(recipe_args(checkpoint, corpus, tmp_path, "--model.dtype", "bfloat16", "--search.budget", "0",
                            "--plots", "false"))
    saved, stored = hp.load_model(str(tmp_path / "best")), hp.load_model(str(checkpoint))
    for (name, a), (_, b) in zip(saved.named_parameters(), stored.named_parameters()):
        assert a.dtype == b.dtype == torch.float32 and torch.equal(a, b), name


BENCH_SEARCH = Path(__file__).resolve().parent.parent / "benchmarks" / "bench_search.py"


def bench_search(*argv) -> subprocess.CompletedProcess:
    """benchmarks/bench_search.py run as a script on argv."""
    return subprocess.run([sys.executable, str(BENCH_SEARCH), *map(str, argv)], capture_output=True, text=True,
                          timeout=300)


@pytest.fixture(scope="module")
def finished(checkpoint, corpus, tmp_path_factory):
    """A finished search's folder (search.json, candidates.jsonl): read it, or copy it to change it."""
    path = tmp_path_factory.mktemp("finished")
    recipe.main(recipe_args(checkpoint, corpus, path, "--save", "false", "--plots", "false"))
    return path


def test_bench_search_transfer_carries_the_recorded_model_and_refuses_a_missing_folder(finished, tmp_path):
    proc = bench_search("--transfer", finished, tmp_path / "t", "--target", 2 * TARGET)
    assert proc.returncode == 0, proc.stderr[-2000:]
    config = json.loads((tmp_path / "t" / "config.json").read_text())
    assert config["hidden_size"] == tiny_model().config.hidden_size   # the tiny model searched, not SmolLM2
    assert config["rope_parameters"]["factor"] == 2 * TARGET / ORIGINAL
    proc = bench_search("--transfer", tmp_path / "nowhere", tmp_path / "u", "--target", 2 * TARGET)
    assert proc.returncode == 2 and proc.stderr.startswith("error: --transfer") and "search.json" in proc.stderr
    assert "Traceback" not in proc.stderr and not (tmp_path / "u").exists()


def test_bench_search_transfer_refuses_an_out_it_cannot_write_in_one_line_before_the_model_loads(
        finished, tmp_path, monkeypatch):
    """OUT an existing file ended in a UsageError traceback, exit code 1, once the model had loaded."""
    taken = tmp_path / "taken"
    taken.write_text("a file")
    proc = bench_search("--transfer", finished, taken, "--target", 2 * TARGET)
    assert proc.returncode == 2 and proc.stderr == f"error: --transfer OUT {taken} is a file; name a folder\n", \
        proc.stderr[-2000:]
    assert taken.read_text() == "a file"
    monkeypatch.syspath_prepend(str(BENCH_SEARCH.parent))
    import bench_search as script

    monkeypatch.setattr(hp, "load_model", lambda *a, **k: pytest.fail("the model loaded"))
    before = sorted((p.name, p.read_bytes()) for p in finished.iterdir() if p.is_file())
    for out, words in ((taken, "is a file"), (finished, "is or lies inside the input")):
        with pytest.raises(UsageError, match=words):
            script.transfer(str(finished), str(out), 2 * TARGET)
    assert sorted((p.name, p.read_bytes()) for p in finished.iterdir() if p.is_file()) == before


def test_bench_search_transfer_takes_unmarked_candidates_only_when_told(finished, tmp_path, monkeypatch, capsys):
    folder = tmp_path / "s"
    shutil.copytree(finished, folder)
    path = folder / "candidates.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    path.write_text("".join(json.dumps({k: v for k, v in r.items() if k != "identity"}) + "\n" for r in rows))
    monkeypatch.syspath_prepend(str(BENCH_SEARCH.parent))
    import bench_search as script

    with pytest.raises(SystemExit) as stop:
        script.transfer(str(folder), str(tmp_path / "t"), 2 * TARGET)
    assert stop.value.code == 2 and "give --unmarked-candidates" in capsys.readouterr().err
    proc = bench_search("--transfer", folder, tmp_path / "t", "--target", 2 * TARGET, "--unmarked-candidates")
    assert proc.returncode == 0 and (tmp_path / "t" / "config.json").is_file(), proc.stderr[-2000:]
    rows[0]["identity"]["weights"] = "0" * 64   # a line another search marked: refused even so
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(InvalidInputError, match="line 1 was scored by another search, of other weights"):
        script.transfer(str(folder), str(tmp_path / "u"), 2 * TARGET, unmarked=True)
    assert not (tmp_path / "u").exists()


def test_the_recipe_refuses_a_search_record_without_its_identity_before_the_model_loads(
        finished, checkpoint, corpus, tmp_path, monkeypatch, capsys):
    out = tmp_path / "out"
    shutil.copytree(finished, out)
    record = json.loads((out / "search.json").read_text())
    del record["identity"]
    (out / "search.json").write_text(json.dumps(record))
    monkeypatch.setattr(hp, "load_model", lambda *a, **k: pytest.fail("the model loaded"))
    line = refusal(capsys, recipe_args(checkpoint, corpus, out, "--save", "false", "--plots", "false"))
    assert f"{out / 'search.json'} has no identity" in line and "start over in a fresh output folder" in line, line


def test_the_time_left_counts_long_passes_and_rejections_at_their_own_cost():
    """The bar showed tqdm's mean over every candidate: seconds-long rejections and minutes-long passes averaged."""
    rows = [{"rejected": False, "seconds": 100.0}, {"rejected": True, "seconds": 2.0},
            {"rejected": False, "seconds": 120.0}, {"rejected": True, "seconds": 4.0}]
    assert search.time_left(rows, total=8) == pytest.approx(4 * (0.5 * 110 + 0.5 * 3))
    assert search.time_left(rows[1:2], total=8) is None       # no long pass yet: no estimate
    assert search.time_left(rows, total=4) == 0.0


def test_a_long_pass_shows_its_own_progress_one_tick_a_layer(monkeypatch):
    from hf_posenc.eval import perplexity

    model, tok = tiny_model(vocab_size=TINY_TEXT_VOCAB), tiny_tokenizer()
    bars = []

    class Bar:   # what the long pass's bar is asked to show
        def __init__(self, total=None, desc="", **kwargs):
            self.total, self.desc, self.n = total, desc, 0
            bars.append(self)

        def update(self, n=1):
            self.n += n

        def close(self):
            pass

    monkeypatch.setattr(perplexity, "tqdm", Bar)
    runner = search.FactorSearch(model, tok, text_ids(), settings(), "unused", progress=True)
    runner.fitness()
    assert [(b.desc, b.n, b.total) for b in bars] == [(f"candidate, {TARGET}-token pass", 2, 2)] * len(runner.sets)
    assert not any(m._forward_hooks or m._forward_hooks_with_kwargs for m in model.modules())   # hooks removed


# -- a search that sees the whole window: bands, the critical pair, racing ----------------------------------

@pytest.mark.parametrize("base, dim, original", [(10000, 64, 2048), (100000, 64, 8192), (500000, 128, 8192),
                                                 (10000, 16, 64)])
def test_the_critical_pair_is_longrope2s_critical_dimension(base, dim, original):
    inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2).double() / dim))
    formula = math.ceil(dim / 2 * math.log(original / (2 * math.pi)) / math.log(base))
    assert search.critical_pair(inv_freq, original) == formula
    periods = 2 * math.pi / inv_freq[formula - 1:formula + 1]
    assert periods[0] <= original < periods[1]   # the last pair that turned, the first that did not


def test_the_critical_floor_holds_every_pair_past_it_at_s_or_more_and_lets_the_top_pass_s():
    space = search.FactorSpace(pairs=16, factor=4.0, original=ORIGINAL, top_range=(0.5, 2.0), floor_from=10)
    assert space.tops == (4.0, 8.0)
    rng = np.random.default_rng(1)
    tops = []
    for x in rng.random((300, space.dims)):
        factors, _ = space.point(x)
        assert min(factors[10:]) >= 4.0 and all(b >= f for f, b in zip(factors, factors[1:]))
        tops.append(factors[-1])
    assert max(tops) > 6.0   # above s: the slow pairs may scale past the factor
    free = search.FactorSpace(pairs=16, factor=4.0, original=ORIGINAL, top_range=(0.5, 2.0))
    assert min(free.point(np.zeros(5))[0][10:]) < 4.0   # without the floor the same point stays below s


def test_a_numeric_critical_floor_holds_the_pairs_past_it_at_that_multiple_of_s():
    s = banded(critical_floor=4 / 3, top_range=[1.0, 2.0])
    space = s.space(pairs=16, critical=10)
    assert space.tops == (pytest.approx(16 / 3), 8.0)
    rng = np.random.default_rng(2)
    for x in rng.random((300, space.dims)):
        factors, _ = space.point(x)
        assert min(factors[10:]) >= 16 / 3 - 1e-6 and all(b >= f for f, b in zip(factors, factors[1:]))
    late = space.point([0.9, 0.0, 0.0, 0.0, 0.0])[0]   # a step past pair 13: the floor alone lifts pairs 10-13
    assert late[9] == 1.0 and late[10:14] == [pytest.approx(16 / 3, abs=1e-6)] * 4
    assert banded(critical_floor=True).space(16, 10) == banded(critical_floor=1.0).space(16, 10)   # true is 1 x s
    assert banded(critical_floor=False).space(16, 10).floor_from is None
    assert s.floor_factor == pytest.approx(16 / 3) and banded(critical_floor=False).floor_factor is None


def banded(**overrides) -> search.SearchSettings:
    return settings(**{"far_from": 64, "band_width": 96, "passages": 8, "passage_tokens": 16, **overrides})


def test_banded_passages_cover_every_band_and_each_band_weighs_alike():
    s = banded()
    assert s.bands == [(64, 160), (160, 256)]
    distances = s.layout(head=1).distances
    for a, b in s.bands:
        assert sum(a <= d < b for d in distances) >= 2, distances
    runner = search.FactorSearch(tiny_model(vocab_size=TINY_TEXT_VOCAB), tiny_tokenizer(), text_ids(), s,
                                 "unused", progress=False)
    w = runner.weights([70, 100, 120, 200])   # one band holds 3, the other 1: each still half the fitness
    assert w.mean() == pytest.approx(1.0) and w[:3].sum() == pytest.approx(w[3:].sum())
    row = runner.fitness()
    assert [b["n"] for b in row["bands"]] == [sum(a <= d < b for d in row["distances"]) for a, b in s.bands]
    means = [b["loss"] for b in row["bands"]]
    assert row["loss"] == pytest.approx(sum(means) / len(means), abs=1e-4)   # the mean of the band means


def test_a_raced_candidate_stops_after_its_first_sequence_only_when_it_is_clearly_worse():
    s = banded(race=True)
    runner = search.FactorSearch(tiny_model(vocab_size=TINY_TEXT_VOCAB), tiny_tokenizer(), text_ids(), s,
                                 "unused", progress=False)
    assert len(runner.sets) == 2
    scored = []
    score = runner._score
    runner._score = lambda sets: scored.append(len(sets)) or score(sets)
    full = runner.fitness()                                   # no incumbent yet: every sequence
    assert scored == [2] and not full["raced_out"] and full["n"] == 8
    scored.clear()
    better = {"losses": [v - 1.0 for v in full["losses"]], "value": full["loss"] - 1.0}
    out = runner.fitness(better)                              # clearly worse than that incumbent: one sequence
    assert scored == [1] and out["raced_out"] and out["n"] == 4 and out["sequences_scored"] == 1
    assert out["estimate"] == pytest.approx(full["loss"], abs=1e-3)   # ranked where its paired gap puts it
    scored.clear()
    worse = {"losses": [v + 1.0 for v in full["losses"]], "value": full["loss"] + 1.0}
    assert not runner.fitness(worse)["raced_out"] and scored == [1, 1]   # not worse: the rest scored too


def test_a_raced_search_returns_a_fully_scored_best_and_resumes_to_the_same_candidates(tmp_path):
    model, tok = tiny_model(vocab_size=TINY_TEXT_VOCAB), tiny_tokenizer()
    s = banded(race=True, critical_floor=True, budget=4)
    best = search.FactorSearch(model, tok, text_ids(), s, tmp_path, progress=False).run()
    rows = search.read_candidates(tmp_path / "candidates.jsonl")
    assert not best["raced_out"] and best["n"] == 8
    assert all(r["value"] >= best["value"] for r in rows if not r["rejected"])
    assert json.loads((tmp_path / "search.json").read_text())["critical_pair"] == search.critical_pair(
        search.rotary_module(model).inv_freq, ORIGINAL)
    path = tmp_path / "candidates.jsonl"
    path.write_text("".join(line + "\n" for line in path.read_text().splitlines()[:6]))
    again = search.FactorSearch(model, tok, text_ids(), s, tmp_path, progress=False).run()
    assert again == best and search.read_candidates(path)[:6] == rows[:6]


def test_a_search_recorded_before_bands_resumes_as_it_ran(tmp_path):
    model, tok = tiny_model(vocab_size=TINY_TEXT_VOCAB), tiny_tokenizer()
    search.FactorSearch(model, tok, text_ids(), settings(budget=0), tmp_path, progress=False).run()
    record = json.loads((tmp_path / "search.json").read_text())
    for key in ("band_width", "critical_floor", "race"):
        del record["settings"][key]
    (tmp_path / "search.json").write_text(json.dumps(record))
    search.FactorSearch(model, tok, text_ids(), settings(budget=1), tmp_path, progress=False).run()
    with pytest.raises(ConfigError, match="race: false there, true now"):
        search.FactorSearch(model, tok, text_ids(), banded(budget=1, race=True), tmp_path, progress=False).run()


@pytest.mark.parametrize("overrides, words", [
    ({"band_width": 300}, "band_width 300 is wider than the distances it bands"),
    ({"band_width": 8}, "band_width must be >= 16"),
    ({"band_width": 32, "passages": 8}, "6 bands of 32 tokens need 2 passages each in every sequence"),
    ({"race": True, "passages": 4, "band_width": None}, "race scores the first of several sequences"),
    ({"race": "yes"}, "race must be true or false"),
    ({"critical_floor": 0.5}, "critical_floor must be true, false or a multiple of s"),
    ({"critical_floor": "high"}, "critical_floor must be true, false or a multiple of s"),
    ({"critical_floor": 2.5}, "floor 2.5 x s is above top_range high 2 x s"),
])
def test_band_and_race_settings_that_cannot_hold_are_refused(overrides, words):
    with pytest.raises(InvalidParameterError, match=words):
        banded(**overrides)


def test_recipe_refuses_band_settings_before_the_model_loads(checkpoint, corpus, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(hp, "load_model", lambda *a, **k: pytest.fail("the model loaded"))
    base = recipe_args(checkpoint, corpus, tmp_path / "out", "--search.far_from", "64")
    assert "band_width 1000 is wider" in refusal(capsys, [*base, "--search.band_width", "1000"])
    assert "race scores the first" in refusal(capsys, [*base, "--search.race", "true"])
    assert "top_range is inverted" in refusal(capsys, [*base, "--search.top_range", "[0.9, 0.5]"])
    assert "above top_range high" in refusal(capsys, [*base, "--search.critical_floor", "3"])
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("content, words", [
    (b"", "is empty"), (b"[]", "holds list"), (b"{}", "has settings null"), (b"null", "holds NoneType"),
    (b'{"settings": null, "passages": [], "unpatched_guard_perplexity": 3}', "has settings null"),
    (b'{"settings": {}, "passages": []}', "has unpatched_guard_perplexity null"),
    (b'{"settings": {}, "passages": [], "unpatched_guard_perplexity": NaN}', "unpatched_guard_perplexity NaN"),
    (b'{"settings": {"mode": "sw', "is not JSON"), (b"\x00\xff\xfe", "is not JSON"),
])
def test_a_damaged_search_record_is_refused_in_one_line_before_the_model_loads(checkpoint, corpus, tmp_path,
                                                                               monkeypatch, capsys, content, words):
    monkeypatch.setattr(hp, "load_model", lambda *a, **k: pytest.fail("the model loaded"))
    out = tmp_path / "out"
    out.mkdir()
    (out / "search.json").write_bytes(content)
    line = refusal(capsys, recipe_args(checkpoint, corpus, out))
    assert "search.json" in line and words in line, line
    assert (out / "search.json").read_bytes() == content and sorted(p.name for p in out.iterdir()) == ["search.json"]


@pytest.mark.parametrize("edit, words", [
    (lambda r: r | {"x": None}, "line 6 has x null"),
    (lambda r: r | {"value": float("nan")}, "line 6 is not JSON"),       # NaN: not a number a search writes
    (lambda r: r | {"value": "low"}, "line 6 has value 'low'"),
    (lambda r: r | {"long_factor": [0.5, 1.0]}, "long_factor that is not a list of finite numbers >= 1"),
    (lambda r: r | {"losses": None}, "no losses and distances"),
    (lambda r: r | {"x": [0.2, 7.0, 0.1, 0.5, 0.5]}, "numbers in [0, 1]"),
    (lambda r: r | {"long_factor": r["long_factor"][:-1]},
     "line 6 has 7 factors in long_factor, where the search's model has 8 rotary pairs"),   # was numpy's broadcast
    (lambda r: r | {"x": r["x"][:-1]}, "line 6 has 4 numbers in x, where a point of the search's form has 5"),
    (lambda r: r | {"identity": {**r["identity"], "weights": "0" * 64}},
     "line 6 was scored by another search, of other weights (weights sha256 000000000000 there"),
    (lambda r: {k: v for k, v in r.items() if k != "identity"}, "line 6 carries no identity of the search"),
])
def test_a_damaged_candidate_line_is_refused_naming_the_file_and_line_before_the_model_loads(
        finished, checkpoint, corpus, tmp_path, monkeypatch, capsys, edit, words):
    out = tmp_path / "out"
    shutil.copytree(finished, out)
    path = out / "candidates.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    cma = next(i for i, r in enumerate(rows) if r["kind"].startswith("cma:") and not r["rejected"])
    assert cma == 5
    rows[cma] = edit(rows[cma])
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    before = path.read_bytes()
    monkeypatch.setattr(hp, "load_model", lambda *a, **k: pytest.fail("the model loaded"))
    line = refusal(capsys, recipe_args(checkpoint, corpus, out, "--save", "false", "--plots", "false"))
    assert "candidates.jsonl line 6" in line and words in line, line
    assert path.read_bytes() == before


def test_the_recipe_refuses_binary_junk_in_the_candidates_naming_the_file_and_line_before_the_model_loads(
        finished, checkpoint, corpus, tmp_path, monkeypatch, capsys):
    out = tmp_path / "out"
    shutil.copytree(finished, out)
    path = out / "candidates.jsonl"
    lines = len(path.read_bytes().splitlines())
    path.write_bytes(path.read_bytes() + b"\x00\xff binary")
    before = path.read_bytes()
    monkeypatch.setattr(hp, "load_model", lambda *a, **k: pytest.fail("the model loaded"))
    line = refusal(capsys, recipe_args(checkpoint, corpus, out, "--save", "false", "--plots", "false"))
    assert f"{path} line {lines + 1} is not JSON: it holds bytes that are not UTF-8 text" in line, line
    assert path.read_bytes() == before


def test_a_guard_perplexity_that_is_not_a_number_is_refused_before_any_candidate(tmp_path):
    model, tok = tiny_model(vocab_size=TINY_TEXT_VOCAB), tiny_tokenizer()
    runner = search.FactorSearch(model, tok, text_ids(), settings(budget=2), tmp_path, progress=False)
    runner.guard_perplexity = lambda: float("nan")
    with pytest.raises(InvalidInputError, match="guard perplexity is nan"):
        runner.run()
    assert not (tmp_path / "search.json").exists() and not (tmp_path / "candidates.jsonl").exists()


def test_summary_shows_the_bests_bands_beside_the_best_seeds():
    """Where the mean of the bands bought the far bands with the middle ones: each band's loss beside the best
    seed's, and the change (the 24k search's best was worse than YaRN at 7-13k)."""
    def bands(*losses):
        return [{"from": 10 * i, "to": 10 * (i + 1), "n": 2, "loss": x} for i, x in enumerate(losses)]
    best, seed = {"kind": "cma:11", "bands": bands(1.35, 2.10)}, {"kind": "seed:YaRN", "bands": bands(1.98, 1.68)}
    lines = recipe.band_lines(best, seed)
    assert lines[0] == "| distance band | passages | loss of the repeats | seed:YaRN | best - seed:YaRN |"
    assert lines[2:4] == ["| 0-10 | 2 | 1.3500 | 1.9800 | -0.6300 |", "| 10-20 | 2 | 2.1000 | 1.6800 | +0.4200 |"]
    assert recipe.band_lines(best, best)[0] == "| distance band | passages | loss of the repeats |"   # a seed won
    assert recipe.band_lines(best)[2] == "| 0-10 | 2 | 1.3500 |"
