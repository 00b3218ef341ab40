"""The Python API (hf_posenc.eval, hf_posenc.train.losses, hf_posenc.metrics) refuses wrong-type,
empty and out-of-range input in one line that names the argument, the value and what is allowed, with the project's error
classes, before any work. Each case ended in a raw traceback (TypeError, KeyError, IndexError, ... from deep inside)
or was silently accepted before; two (lengths=[10**7], hops=10**5) ran until memory ran out."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import Any, Callable

import pytest
import torch
from test_learned import tiny
from tiny import TINY_TEXT_VOCAB, tiny_model, tiny_tokenizer

import hf_posenc as hp
import hf_posenc.metrics
from hf_posenc import eval as hpe
from hf_posenc import causal_lm
from hf_posenc.train import losses, mixed_windows
from hf_posenc.eval import probes, recall, ruler, stats
from hf_posenc.eval import longppl as lp

PROSE = "".join(f"Verse {i}: and the lamb went unto {100 + i} hills by the river.\n" for i in range(400))
IDS = torch.full((1, 16), 5)
MASK = torch.ones(1, 16, dtype=torch.long)
DOC = list(range(3, 200))


# -- what the cases run on, built once ----------------------------------------------------------------------

@cache
def tok():
    return tiny_tokenizer()


@cache
def llama():
    return tiny_model(vocab_size=TINY_TEXT_VOCAB, max_position_embeddings=4096)


@cache
def encoder():
    return tiny("bert", vocab_size=TINY_TEXT_VOCAB)          # a masked LM: no causal head


@cache
def table():
    return tiny("gpt2", vocab_size=TINY_TEXT_VOCAB)          # a learned table of 32 positions


@cache
def dynamic():
    return hp.patch(tiny_model(vocab_size=TINY_TEXT_VOCAB), "dynamic", factor=2)


@cache
def layout():
    return recall.plan_layout(512, passages=2, passage_tokens=16)


@cache
def sets():
    return recall.make_recall(tok(), PROSE, layout())


@cache
def recall_rows():
    return recall.score_recall(llama(), sets(), progress=False)


@cache
def samples():
    return ruler.make_samples("passkey", tok(), lengths=[600], samples=1)


@cache
def sample_rows():
    return ruler.score_samples(llama(), samples(), progress=False)


@cache
def trials():
    return hpe.make_trials("passkey", tok(), lengths=[600], depths=[0.5])


def text_longppl(model, **kw):
    return lp.longppl(model, tok(), ["hello world " * 10], short_window=4, max_length=32, **kw)


@dataclass
class Case:
    id: str
    call: Callable[[], Any]
    error: type
    match: str


CASES = [
    # eval.recall
    Case("make_recall-text-none", lambda: recall.make_recall(tok(), None, layout()), hp.InvalidInputError,
         "the recall text must be a str or its token ids (a list of ints), got None"),
    Case("make_recall-text-int", lambda: recall.make_recall(tok(), 5, layout()), hp.InvalidInputError,
         "got 5 (int)"),
    Case("make_recall-text-words", lambda: recall.make_recall(tok(), ["a", "b"], layout()), hp.InvalidInputError,
         "the recall text's token ids must be token ids (a list of ints), but it holds 'a'"),
    Case("make_recall-layout-none", lambda: recall.make_recall(tok(), PROSE, None), hp.ParameterTypeError,
         "layout must be a Layout (plan_layout gives one), got None"),
    Case("make_recall-prefix-none", lambda: recall.make_recall(tok(), PROSE, layout(), prefix=None),
         hp.InvalidInputError, "prefix must be token ids (a list of ints), got None"),
    Case("make_recall-tokenizer-none", lambda: recall.make_recall(None, PROSE, layout()), hp.InvalidInputError,
         "tokenizer must be a transformers tokenizer"),
    Case("plan_layout-distances-int", lambda: recall.plan_layout(512, passages=2, passage_tokens=16, distances=100),
         hp.ParameterTypeError, "distances must be a list of ints (token distances) or None, got 100"),
    Case("plan_layout-length-huge", lambda: recall.plan_layout(10**7, passages=2), hp.InvalidParameterError,
         "length must be <= 1048576, got 10000000"),
    Case("distance_bins-length-0", lambda: recall.distance_bins(0), hp.InvalidParameterError,
         "length must be >= 1, got 0"),
    Case("summarize_recall-empty-row", lambda: recall.summarize_recall([{}]), hp.InvalidInputError,
         "rows[0] is not a row of score_recall: it lacks distance, form, gap"),
    Case("summarize_recall-length-below-the-distances", lambda: recall.summarize_recall(recall_rows(), length=100),
         hp.InvalidParameterError, "length=100 is not longer than the rows' longest distance"),
    Case("summarize_recall-length-0", lambda: recall.summarize_recall(recall_rows(), length=0),
         hp.InvalidParameterError, "length must be >= 1, got 0"),
    Case("score_recall-control-a-str", lambda: recall.score_recall(llama(), sets(), control="no", progress=False),
         hp.ParameterTypeError, "control must be a bool, got 'no'"),
    Case("score_recall-not-sets", lambda: recall.score_recall(llama(), [1], progress=False), hp.InvalidInputError,
         "sets[0] must be a RecallSet (make_recall gives them), got 1"),
    Case("score_recall-encoder", lambda: recall.score_recall(encoder(), sets(), progress=False),
         hp.UnsupportedModelError, "score_recall: model is a BertForMaskedLM (bert), not a causal LM"),
    Case("score_recall-no-model", lambda: recall.score_recall(None, sets(), progress=False), hp.InvalidInputError,
         "score_recall: model must be a transformers causal LM"),
    # eval.ruler
    Case("make_samples-lengths-an-int", lambda: ruler.make_samples("passkey", tok(), lengths=900),
         hp.ParameterTypeError, "lengths must be a list of ints (token counts), got 900 (int)"),
    Case("make_samples-depths-a-float", lambda: ruler.make_samples("passkey", tok(), lengths=[600], depths=0.5),
         hp.ParameterTypeError, "depths must be a list of numbers in [0, 1], got 0.5"),
    Case("make_samples-lengths-huge", lambda: ruler.make_samples("passkey", tok(), lengths=[10**7]),
         hp.InvalidParameterError, "lengths[0]=10000000 is past the longest prompt built here, 1048576 tokens"),
    Case("make_samples-hops-huge", lambda: ruler.make_samples("vt", tok(), lengths=[600], hops=10**5),
         hp.InvalidParameterError, "hops=100000 makes a chain of 100001 variable lines"),
    Case("make_samples-haystack-an-int", lambda: ruler.make_samples("single", tok(), lengths=[600], haystack=5),
         hp.ParameterTypeError, "haystack must be a text (a str), got 5"),
    Case("make_samples-seed-a-str", lambda: ruler.make_samples("passkey", tok(), lengths=[600], seed="a"),
         hp.ParameterTypeError, "seed must be an int, got 'a'"),
    Case("make_samples-bos-unknown", lambda: ruler.make_samples("passkey", tok(), lengths=[600], bos="x"),
         hp.InvalidParameterError, "bos must be 'auto', True or False, got 'x'"),
    Case("score_samples-encoder", lambda: ruler.score_samples(encoder(), samples(), progress=False),
         hp.UnsupportedModelError, "score_samples: model is a BertForMaskedLM (bert), not a causal LM"),
    Case("score_samples-past-the-table", lambda: ruler.score_samples(table(), samples(), progress=False),
         hp.SequenceTooLongError, "an input of 544 tokens is longer than this model's learned position table"),
    Case("score_samples-not-samples", lambda: ruler.score_samples(llama(), [1], progress=False),
         hp.InvalidInputError, "samples must be a non-empty list of the Samples make_samples gives"),
    Case("summarize_samples-empty-row", lambda: ruler.summarize_samples([{}]), hp.InvalidInputError,
         "rows[0] is not a row of score_samples: it lacks correct, family, length"),
    Case("summarize_samples-none", lambda: ruler.summarize_samples(None), hp.InvalidInputError,
         "summarize_samples needs the rows of score_samples, got None"),
    Case("summarize_samples-no-rows", lambda: ruler.summarize_samples([]), hp.InvalidInputError,
         "summarize_samples needs the rows of score_samples, got []"),
    Case("summarize_samples-threshold-past-1", lambda: ruler.summarize_samples(sample_rows(), threshold=1.5),
         hp.InvalidParameterError, "threshold must be <= 1, got 1.5"),
    Case("summarize_samples-threshold-negative", lambda: ruler.summarize_samples(sample_rows(), threshold=-0.1),
         hp.InvalidParameterError, "threshold must be >= 0, got -0.1"),
    Case("summarize_samples-threshold-a-str", lambda: ruler.summarize_samples(sample_rows(), threshold="a"),
         hp.ParameterTypeError, "threshold must be a number, got 'a'"),
    Case("summarize_samples-share-past-1",
         lambda: ruler.summarize_samples(sample_rows(), native=600, share_of_native=1.5),
         hp.InvalidParameterError, "share_of_native must be <= 1, got 1.5"),
    Case("summarize_samples-native-alone", lambda: ruler.summarize_samples(sample_rows(), native=600),
         hp.InvalidParameterError, "native and share_of_native go together"),
    Case("summarize_samples-share-alone", lambda: ruler.summarize_samples(sample_rows(), share_of_native=0.5),
         hp.InvalidParameterError, "got native=None, share_of_native=0.5"),
    Case("summarize_samples-native-not-measured",
         lambda: ruler.summarize_samples(sample_rows(), native=999, share_of_native=0.5),
         hp.InvalidParameterError, "native=999 is not a length measured for passkey (600)"),
    # eval.probes
    Case("common_prefix-empty", lambda: probes.common_prefix([]), hp.InvalidInputError,
         "common_prefix's sequences must be a non-empty list of token id sequences, got []"),
    Case("common_prefix-none", lambda: probes.common_prefix(None), hp.InvalidInputError, "got None"),
    Case("score_probes-share-a-str", lambda: probes.score_probes(llama(), [([1, 2], [3])], share="yes"),
         hp.ParameterTypeError, "share must be a bool, got 'yes'"),
    Case("score_probes-share-on-a-length-dependent-model",
         lambda: probes.score_probes(dynamic(), [([1, 2, 3], [3]), ([1, 2, 4], [5])], share=True),
         hp.InvalidParameterError, "share=True runs the probes on one cached context, but this model's positions"),
    Case("score_probes-not-a-pair", lambda: probes.score_probes(llama(), [1]), hp.InvalidInputError,
         "probes[0] must be a (prompt ids, answer ids) pair, got 1"),
    Case("score_probes-past-the-vocabulary", lambda: probes.score_probes(llama(), [([1, 2], [9999])]),
         hp.InvalidInputError, "probes[0] hold token ids 1..9999; this model's vocabulary is 0..259"),
    Case("score_probes-negative-id", lambda: probes.score_probes(llama(), [([1, -2], [3])]), hp.InvalidInputError,
         "probes[0] hold token ids -2..3"),
    Case("score_probes-float-id", lambda: probes.score_probes(llama(), [([1, 2.5], [3])]), hp.InvalidInputError,
         "probes[0] prompt must be token ids (a list of ints), but it holds 2.5"),
    Case("score_probes-encoder", lambda: probes.score_probes(encoder(), [([1, 2], [3])]), hp.UnsupportedModelError,
         "not a causal LM"),
    Case("score_probes-past-the-table", lambda: probes.score_probes(table(), [(list(range(3, 90)), [3])]),
         hp.SequenceTooLongError, "an input of 88 tokens is longer than this model's learned position table"),
    # eval.stats
    Case("bootstrap-samples-0", lambda: stats.bootstrap_mean([1.0, 2.0], samples=0), hp.InvalidParameterError,
         "samples must be >= 1, got 0"),
    Case("bootstrap-samples-a-str", lambda: stats.bootstrap_mean([1.0, 2.0], samples="a"), hp.ParameterTypeError,
         "samples must be an int, got 'a'"),
    Case("bootstrap-values-none", lambda: stats.bootstrap_mean(None), hp.InvalidInputError,
         "values must be a list of numbers, got None"),
    Case("bootstrap-values-a-str", lambda: stats.bootstrap_mean("abc"), hp.InvalidInputError,
         "values must be a list of numbers, got 'abc'"),
    Case("bootstrap-seed-a-str", lambda: stats.bootstrap_mean([1.0, 2.0], seed="a"), hp.ParameterTypeError,
         "seed must be an int, got 'a'"),
    Case("paired-none", lambda: stats.paired_difference(None, [1.0]), hp.InvalidInputError,
         "a must be a list of numbers, got None"),
    Case("interval_text-empty", lambda: stats.interval_text({}), hp.InvalidInputError,
         "interval_text needs a cell of bootstrap_mean (n, mean, half_width); {} lacks n, mean, half_width"),
    Case("interval_text-none", lambda: stats.interval_text(None), hp.InvalidInputError, "None lacks n"),
    Case("interval_text-digits-negative", lambda: stats.interval_text(stats.bootstrap_mean([1.0, 2.0]), digits=-1),
         hp.InvalidParameterError, "digits must be >= 0, got -1"),
    Case("share_text-empty", lambda: stats.share_text({}), hp.InvalidInputError,
         "share_text needs a cell of wilson (n, found, accuracy, low, high)"),
    Case("wilson-z-negative", lambda: stats.wilson(5, 10, z=-1.96), hp.InvalidParameterError,
         "z must be > 0, got -1.96"),
    Case("wilson-z-a-str", lambda: stats.wilson(5, 10, z="a"), hp.ParameterTypeError, "z must be a number"),
    Case("wilson-found-a-bool", lambda: stats.wilson(True, 10), hp.InvalidInputError,
         "wilson needs whole counts 0 <= found <= n, got found=True"),
    Case("effective_length-threshold-a-str", lambda: stats.effective_length({1: 0.5}, "a"), hp.ParameterTypeError,
         "threshold must be a number, got 'a'"),
    Case("effective_length-no-scores", lambda: stats.effective_length(None, 0.5), hp.InvalidInputError,
         "scores must map each length to its score (a number), got None"),
    # hf_posenc.train.losses
    Case("longce_weights-clip-0", lambda: losses.longce_weights(torch.zeros(3), torch.zeros(3), clip=0),
         hp.InvalidParameterError, "clip must be a number >= 1 (the largest weight), got 0"),
    Case("longce_weights-floor-2", lambda: losses.longce_weights(torch.zeros(3), torch.zeros(3), clip=5, floor=2),
         hp.InvalidParameterError, "floor must be a number in [0, 1] (the smallest weight), got 2"),
    Case("longce_weights-clip-a-str", lambda: losses.longce_weights(torch.zeros(3), torch.zeros(3), clip="a"),
         hp.InvalidParameterError, "clip must be a number >= 1 (the largest weight), got 'a'"),
    Case("longce_weights-shapes-differ", lambda: losses.longce_weights(torch.zeros(3), torch.zeros(4), clip=5),
         hp.InvalidInputError, "long and short must be loss tensors of one shape"),
    Case("LongCE-window-0", lambda: losses.LongCE(0, 1), hp.InvalidParameterError,
         "window must be an int >= 1, got 0"),
    Case("longce_loss-encoder", lambda: losses.longce_loss(encoder(), IDS, MASK, losses.LongCE(4, 2)),
         hp.UnsupportedModelError, "longce_loss: model is a BertForMaskedLM (bert), not a causal LM"),
    Case("longce_loss-learned-table", lambda: losses.longce_loss(table(), IDS, MASK, losses.LongCE(4, 2)),
         hp.UnsupportedModelError, "this model's positions are 'learned': patch it to rope first"),
    Case("longce_loss-no-longce", lambda: losses.longce_loss(llama(), IDS, MASK, None), hp.ParameterTypeError,
         "longce must be a LongCE(window, stride, ...), got None"),
    Case("longce_loss-past-the-vocabulary",
         lambda: losses.longce_loss(llama(), torch.full((1, 16), 9999), MASK, losses.LongCE(4, 2)),
         hp.InvalidInputError, "input_ids hold token ids 9999..9999; this model's vocabulary is 0..259"),
    Case("longce_loss-chunk-negative", lambda: losses.longce_loss(llama(), IDS, MASK, losses.LongCE(4, 2), chunk=-1),
         hp.InvalidParameterError, "chunk must be >= 0, got -1"),
    Case("longce_loss-mask-of-another-shape",
         lambda: losses.longce_loss(llama(), IDS, MASK[:, :8], losses.LongCE(4, 2)),
         hp.InvalidInputError, "attention_mask must be an int tensor of input_ids' shape (1, 16), got (1, 8)"),
    Case("lm_loss-encoder", lambda: losses.lm_loss(encoder(), IDS, MASK), hp.UnsupportedModelError,
         "lm_loss: model is a BertForMaskedLM (bert), not a causal LM"),
    Case("chunked_lm_loss-chunk-0", lambda: losses.chunked_lm_loss(llama(), IDS, MASK, 0), hp.InvalidParameterError,
         "chunk must be >= 1, got 0"),
    Case("TrainingLoss-unknown-objective", lambda: losses.TrainingLoss(llama(), objective="x", causal=True),
         hp.InvalidParameterError, "objective must be 'lm' or 'distill', got 'x'"),
    Case("short_context_losses-window-0", lambda: losses.short_context_losses(llama(), IDS, MASK, 0, 0),
         hp.InvalidParameterError, "window must be an int >= 1, got 0"),
    # hf_posenc.metrics
    Case("longppl-encoder", lambda: text_longppl(encoder()), hp.UnsupportedModelError,
         "longppl: model is a BertForMaskedLM (bert), not a causal LM"),
    Case("longppl-past-the-vocabulary", lambda: text_longppl(tiny_model()), hp.InvalidInputError,
         "texts[0]'s token ids hold token ids"),
    Case("longppl-no-tokenizer",
         lambda: lp.longppl(llama(), None, ["hello world " * 10], short_window=4, max_length=32),
         hp.InvalidInputError, "longppl tokenizer must be a transformers tokenizer (hp.load_tokenizer), got None"),
    Case("longppl-no-model", lambda: text_longppl(None), hp.InvalidInputError,
         "longppl: model must be a transformers causal LM"),
    Case("longppl-past-the-table", lambda: lp.longppl(table(), tok(), ["hello world " * 10], short_window=4,
                                                      max_length=64), hp.SequenceTooLongError,
         "is longer than this model's learned position table, which holds 32 positions"),
    Case("token_losses-encoder", lambda: lp.token_losses(encoder(), IDS), hp.UnsupportedModelError,
         "not a causal LM"),
    Case("key_tokens-alpha-a-str", lambda: lp.key_tokens(torch.zeros(3), torch.zeros(3), alpha="a"),
         hp.InvalidParameterError, "longppl alpha must be a finite number, got 'a'"),
    Case("metrics-unknown", lambda: hf_posenc.metrics.path("x"), hp.InvalidParameterError,
         "no local metric 'x'; available: perplexity"),
    # eval.retrieval and eval.perplexity
    Case("make_trials-lengths-an-int", lambda: hpe.make_trials("passkey", tok(), lengths=600, depths=[0.5]),
         hp.ParameterTypeError, "lengths must be a list of ints (token counts), got 600 (int)"),
    Case("make_trials-lengths-huge", lambda: hpe.make_trials("passkey", tok(), lengths=[10**7], depths=[0.5]),
         hp.InvalidParameterError, "lengths[0]=10000000 is past the longest prompt built here"),
    Case("make_trials-bos-unknown", lambda: hpe.make_trials("passkey", tok(), lengths=[600], depths=[0.5], bos="x"),
         hp.InvalidParameterError, "bos must be 'auto', True or False, got 'x'"),
    Case("make_trials-haystack-an-int",
         lambda: hpe.make_trials("needle", tok(), lengths=[600], depths=[0.5], haystack=5),
         hp.ParameterTypeError, "haystack must be a text (a str), got 5"),
    Case("score_trials-encoder", lambda: hpe.score_trials(encoder(), trials(), progress=False),
         hp.UnsupportedModelError, "score_trials: model is a BertForMaskedLM (bert), not a causal LM"),
    Case("score_trials-past-the-table", lambda: hpe.score_trials(table(), trials(), progress=False),
         hp.SequenceTooLongError, "an input of 598 tokens is longer than this model's learned position table"),
    Case("score_trials-none", lambda: hpe.score_trials(llama(), None, progress=False), hp.InvalidInputError,
         "trials must be a non-empty list of the Trials make_trials gives, got None"),
    Case("score_trials-past-the-vocabulary", lambda: hpe.score_trials(tiny_model(), trials(), progress=False),
         hp.InvalidInputError, "trials[0] hold token ids"),
    Case("summarize-nothing", lambda: hpe.summarize([], []), hp.InvalidInputError,
         "summarize needs at least one trial and its score, got none"),
    Case("token_nll-encoder", lambda: hpe.token_nll(encoder(), torch.ones(1, 8, dtype=torch.long)),
         hp.UnsupportedModelError, "token_nll: model is a BertForMaskedLM (bert), not a causal LM"),
    Case("document_perplexity-no-documents", lambda: hpe.document_perplexity(llama(), None, max_length=8),
         hp.InvalidInputError, "document_perplexity takes documents as a list of token id lists"),
    Case("document_perplexity-ints-for-documents", lambda: hpe.document_perplexity(llama(), [1, 2], max_length=8),
         hp.InvalidInputError, "documents[0] must be a list of int token ids, got shape ()"),
    Case("document_perplexity-a-text", lambda: hpe.document_perplexity(llama(), ["hello"], max_length=8),
         hp.InvalidInputError, "documents[0] must be token ids (a list of ints, corpora.tokenize's input_ids), got "
         "'hello'"),
    Case("perplexity_by_length-lengths-an-int", lambda: hpe.perplexity_by_length(llama(), [DOC], 8),
         hp.ParameterTypeError, "lengths must be a list of ints (token counts), got 8 (int)"),
    Case("perplexity_by_length-one_pass-a-str", lambda: hpe.perplexity_by_length(llama(), [DOC], [8], one_pass="no"),
         hp.ParameterTypeError, "one_pass must be a bool, got 'no'"),
    Case("perplexity_by_length-no-documents", lambda: hpe.perplexity_by_length(llama(), None, [8]),
         hp.InvalidInputError, "perplexity_by_length takes documents as a list of token id lists"),
    Case("strided-no-text", lambda: hpe.strided_perplexity(llama(), None, window=8, stride=4), hp.InvalidInputError,
         "input_ids must be token ids (a list of ints, corpora.tokenize's input_ids), got None"),
    Case("strided-bos-a-str", lambda: hpe.strided_perplexity(llama(), DOC, window=8, stride=4, bos="a"),
         hp.ParameterTypeError, "bos must be an int, got 'a'"),
    Case("strided-bos-past-the-vocabulary", lambda: hpe.strided_perplexity(llama(), DOC, window=8, stride=4, bos=999),
         hp.InvalidInputError, "bos=999 is not a token id of this model (0..259)"),
    Case("curve-prefix-a-str", lambda: hpe.perplexity_curve(llama(), [DOC], length=8, prefix="no"),
         hp.ParameterTypeError, "prefix must be a bool, got 'no'"),
    Case("curve-no-documents", lambda: hpe.perplexity_curve(llama(), None, length=8), hp.InvalidInputError,
         "perplexity_curve takes documents as a list of token id lists"),
    Case("curve_perplexity-start-a-str", lambda: hpe.curve_perplexity({"positions": [7], "nll": [1.0]}, "a"),
         hp.ParameterTypeError, "start must be a number, got 'a'"),
    Case("curve_perplexity-end-before-start", lambda: hpe.curve_perplexity({"positions": [7], "nll": [1.0]}, 10, 2),
         hp.InvalidParameterError, "end must be > 10, got 2"),
    Case("build_trial-depth-a-str", lambda: hpe.build_trial(tok(), hpe.Haystack(tok(), "abc\n"), needle="x",
                                                            question="q", answer="a", length=300, depth="a"),
         hp.ParameterTypeError, "depth must be a number, got 'a'"),
    Case("haystack-none", lambda: hpe.Haystack(tok(), None), hp.ParameterTypeError,
         "the haystack must be a text (a str), got None"),
    Case("cell_sequences-no-passages", lambda: recall.cell_sequences(512, 0), hp.InvalidParameterError,
         "passages must be >= 1, got 0"),
    Case("cell_sequences-length-a-str", lambda: recall.cell_sequences("a", 2), hp.ParameterTypeError,
         "length must be an int, got 'a'"),
    Case("summarize_samples-row-of-wrong-types", lambda: ruler.summarize_samples(
        [{"family": "x", "length": "a", "correct": "yes", "logprob": None, "shared": True}]), hp.InvalidInputError,
         "rows[0] is not a row of score_samples: length an int, correct a bool and logprob a number, got 'a'"),
    Case("distill_loss-no-teacher", lambda: losses.distill_loss(llama(), None, IDS, MASK, causal=True),
         hp.InvalidInputError, "distill needs the teacher model (the unpatched model), got None"),
    Case("output_logits_mismatch-no-model", lambda: causal_lm.output_logits_mismatch(None), hp.InvalidInputError,
         "output_logits_mismatch needs a transformers model, got None"),
    Case("next_token_losses-chunk-negative",
         lambda: causal_lm.next_token_losses(llama(), torch.zeros(1, 4, 64), torch.ones(1, 4, dtype=torch.long), -1),
         hp.InvalidParameterError, "chunk must be >= 0, got -1"),
    Case("is_length_dependent-none", lambda: hpe.is_length_dependent(None), hp.InvalidInputError,
         "model must be a transformers model, got None"),
    # issue 47's sweep: answers and tracebacks where a refusal was due
    Case("effective_length-threshold-2", lambda: stats.effective_length({1: 0.5}, 2), hp.InvalidParameterError,
         "threshold must be a share in (0, 1)"),
    Case("effective_length-threshold-0", lambda: stats.effective_length({1: 0.5}, 0), hp.InvalidParameterError,
         "threshold must be > 0"),
    Case("make_samples-a-list-of-families", lambda: ruler.make_samples(["passkey"], tok(), lengths=[600]),
         hp.InvalidParameterError, "unknown retrieval family ['passkey'] (one family a call"),
    Case("key_tokens-lengths-differ", lambda: lp.key_tokens(torch.zeros(5), torch.zeros(4)), hp.InvalidInputError,
         "tensors of one shape, got (5,) and (4,)"),
    Case("drawn_short-share-a-str", lambda: mixed_windows.drawn_short(seed=0, index=0, share="0.5"),
         hp.ParameterTypeError, "share must be a number"),
    Case("drawn_short-seed-none", lambda: mixed_windows.drawn_short(seed=None, index=0, share=0.5),
         hp.InvalidParameterError, "seed is required"),
    Case("drawn_short-index-negative", lambda: mixed_windows.drawn_short(seed=0, index=-1, share=0.5),
         hp.InvalidParameterError, "index must be >= 0"),
    Case("drawn_short-index-a-float", lambda: mixed_windows.drawn_short(seed=0, index=2.5, share=0.5),
         hp.ParameterTypeError, "index must be an int"),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input_to_the_python_api_is_refused_in_one_line(case):
    with pytest.raises(case.error) as raised:
        case.call()
    message = str(raised.value)
    assert case.match in message, message
    assert "\n" not in message


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


@pytest.mark.parametrize("cfg", [None, {}, "recipes/configs/smollm2_yarn_16k_finetune.yaml"])
def test_finetune_recipe_refuses_what_is_not_a_config(cfg):
    from hf_posenc.errors import ParameterTypeError
    from hf_posenc.recipes.finetune_recipe import FinetuneRecipe

    with pytest.raises(ParameterTypeError, match="FinetuneRecipe needs a FinetuneConfig"):
        FinetuneRecipe(cfg)
