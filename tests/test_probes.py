"""Probes on a shared prefill (hf_posenc/eval/probes.py) against a full forward per probe, for every registered
method on every causal family of the contract suite (tests/test_contracts.py's pairs): float32, tiny models,
a context past the original length and three probes that share it. `pytest -m contract -k <method>` runs a
method's pairs here with the rest of its contract. Bad input to the probes is refused in one line naming the
argument, before any forward."""

from __future__ import annotations

import pytest
import torch
from test_contracts import CASES, auto_class, build, params_of, patch
from transformers import AutoModelForCausalLM
from test_attention_methods import randomize_tables
from refusals import CallCase, dynamic, encoder, llama, refused_in_one_line, table
from tiny import tiny_model, token_ids

import hf_posenc as hp
from hf_posenc.eval import probes
from hf_posenc.eval import probes as hpp

pytestmark = pytest.mark.contract

# every method on its reference family with each example, and the contract suite's quick share of the others:
# the cache path is the family's, so the wide sweep adds time, not cover
CAUSAL = params_of([c for c in CASES if auto_class(c.model_type) is AutoModelForCausalLM and c.tier != "slow"])


def probe_set(original: int, vocab: int = 120) -> list[tuple[list[int], list[int]]]:
    context = (token_ids(3 * original // 2, vocab=vocab - 3, seed=1)[0] + 3).tolist()
    return [(context + [5 + i, 7, 9 + i], [11 + i, 4, 6]) for i in range(3)]


def full_forward_logprobs(model, probe_list) -> list[float]:
    return [s["logprob"] for s in hpp.score_probes(model, probe_list, share=False)["scores"]]


@pytest.mark.parametrize("case", CAUSAL)
def test_probes_on_a_restored_cache_equal_full_forwards(case):
    model = build(case.model_type)
    original = patch(case, model)
    randomize_tables(model)
    probes = probe_set(original, vocab=min(120, model.config.get_text_config().vocab_size))
    shared = hpp.score_probes(model, probes)
    assert shared["shared"] == hpp.can_share(model)
    if case.cls.length_dependent:   # frequencies follow the input length: a full forward per probe, said so
        assert not shared["shared"]
    else:
        assert shared["shared"] and shared["prefix"] == 3 * original // 2
    reference = full_forward_logprobs(model, probes)
    torch.testing.assert_close([s["logprob"] for s in shared["scores"]], reference, atol=1e-5, rtol=1e-5)


def test_the_unpatched_model_shares_its_prefill_exactly_and_runs_fewer_tokens():
    model = tiny_model()
    probes = probe_set(48)
    shared = hpp.score_probes(model, probes)
    assert shared["shared"] and shared["tokens"] == 72 + 3 * 6
    torch.testing.assert_close([s["logprob"] for s in shared["scores"]], full_forward_logprobs(model, probes),
                               atol=1e-5, rtol=1e-5)
    # the restore is what makes it exact: without it the second probe would see the first one's tokens
    assert [s["correct"] for s in shared["scores"]] == [s["correct"] for s in
                                                         hpp.score_probes(model, probes, share=False)["scores"]]


def test_probes_that_share_nothing_run_whole():
    model = tiny_model()
    probes = [([1, 2, 3], [4]), ([5, 6, 7], [8])]
    out = hpp.score_probes(model, probes)
    assert not out["shared"] and out["tokens"] == 8


@pytest.mark.parametrize("bad", [[], [([], [1])], [([1, 2], [])]])
def test_empty_probes_are_refused(bad):
    with pytest.raises(hp.InvalidInputError):
        hpp.score_probes(tiny_model(), bad)


@pytest.mark.parametrize("keeps_logits", [True, False])
def test_the_shared_prefill_never_runs_the_output_layer_over_the_context(keeps_logits, monkeypatch):
    """The prefill's logits ([1, n, vocab]) were once computed and thrown away; only what is scored may reach
    the output layer, and the scores stay those of a full forward per probe. Without `logits_to_keep` (a few
    models' forwards) the prefill runs the decoder under the head, and a probe its own tokens whole."""
    model = tiny_model()
    if not keeps_logits:
        monkeypatch.setattr(hpp, "_keeps_logits", lambda model: False)
    probes = probe_set(48)                      # a 72-token context, three probes of 3 prompt + 3 answer tokens
    positions = []
    hook = model.get_output_embeddings().register_forward_hook(lambda m, args, out: positions.append(args[0].shape[-2]))
    try:
        shared = hpp.score_probes(model, probes)
    finally:
        hook.remove()
    assert shared["shared"] and shared["prefix"] == 72
    assert max(positions) <= (4 if keeps_logits else 6), positions   # the answer and the position before it; a probe
    torch.testing.assert_close([s["logprob"] for s in shared["scores"]], full_forward_logprobs(model, probes),
                               atol=1e-5, rtol=1e-5)


# -- wrong-type, empty and out-of-range input to the probes: one line naming the argument -------------------------

CALL_CASES = [
    CallCase("common_prefix-empty", lambda: probes.common_prefix([]), hp.InvalidInputError,
             "common_prefix's sequences must be a non-empty list of token id sequences, got []"),
    CallCase("common_prefix-none", lambda: probes.common_prefix(None), hp.InvalidInputError, "got None"),
    CallCase("score_probes-share-a-str", lambda: probes.score_probes(llama(), [([1, 2], [3])], share="yes"),
             hp.ParameterTypeError, "share must be a bool, got 'yes'"),
    CallCase("score_probes-share-on-a-length-dependent-model",
             lambda: probes.score_probes(dynamic(), [([1, 2, 3], [3]), ([1, 2, 4], [5])], share=True),
             hp.InvalidParameterError, "share=True runs the probes on one cached context, but this model's positions"),
    CallCase("score_probes-not-a-pair", lambda: probes.score_probes(llama(), [1]), hp.InvalidInputError,
             "probes[0] must be a (prompt ids, answer ids) pair, got 1"),
    CallCase("score_probes-past-the-vocabulary", lambda: probes.score_probes(llama(), [([1, 2], [9999])]),
             hp.InvalidInputError, "probes[0] hold token ids 1..9999; this model's vocabulary is 0..259"),
    CallCase("score_probes-negative-id", lambda: probes.score_probes(llama(), [([1, -2], [3])]), hp.InvalidInputError,
             "probes[0] hold token ids -2..3"),
    CallCase("score_probes-float-id", lambda: probes.score_probes(llama(), [([1, 2.5], [3])]), hp.InvalidInputError,
             "probes[0] prompt must be token ids (a list of ints), but it holds 2.5"),
    CallCase("score_probes-encoder", lambda: probes.score_probes(encoder(), [([1, 2], [3])]), hp.UnsupportedModelError,
             "not a causal LM"),
    CallCase("score_probes-past-the-table", lambda: probes.score_probes(table(), [(list(range(3, 90)), [3])]),
             hp.SequenceTooLongError, "an input of 88 tokens is longer than this model's learned position table"),
]


@pytest.mark.parametrize("case", CALL_CASES, ids=[c.id for c in CALL_CASES])
def test_bad_input_to_the_python_api_is_refused_in_one_line(case):
    refused_in_one_line(case)
