"""Measure what a positional patch did: perplexity (per document, strided, by position), passkey
and needle retrieval, their tables (`hf_posenc.eval.report`) and figures (`hf_posenc.eval.plots`, needs matplotlib).

    from hf_posenc import eval as hpe
    curve = hpe.perplexity_curve(model, docs, length=16384)   # docs: token ids, e.g. corpora.tokenize(...)
    hpe.perplexity_by_length(model, docs, [2048, 4096, 8192, 16384])
    trials = hpe.make_trials("passkey", tokenizer, lengths=[4096, 16384], depths=[0.1, 0.5, 0.9])
    hpe.summarize(trials, hpe.score_trials(model, trials))

Recall at a distance (`hf_posenc.eval.recall`), RULER's retrieval families on one shared prefill
(`hf_posenc.eval.ruler`, `hf_posenc.eval.probes`) and the intervals every cell carries (`hf_posenc.eval.stats`):

    from hf_posenc.eval import recall, ruler, stats
    layout = recall.plan_layout(32768, passages=48)
    summary = recall.summarize_recall(recall.score_recall(model, recall.make_recall(tokenizer, text, layout)))
    rows = ruler.score_samples(model, ruler.make_samples("multikey", tokenizer, lengths=[4096], haystack=text))
"""

from .perplexity import (
    curve_perplexity,
    document_perplexity,
    is_length_dependent,
    perplexity_by_length,
    perplexity_curve,
    strided_perplexity,
    token_nll,
)
from . import probes, recall, ruler, stats
from .retrieval import KINDS, Haystack, Trial, build_trial, make_trials, score_trials, summarize
from .variants import expand_grid, parse_variant, variant, variant_params

__all__ = [
    "token_nll", "document_perplexity", "perplexity_by_length", "strided_perplexity", "perplexity_curve", "curve_perplexity",
    "is_length_dependent", "KINDS", "Trial", "Haystack", "build_trial", "make_trials", "score_trials", "summarize",
    "parse_variant", "expand_grid", "variant_params", "variant", "recall", "ruler", "probes", "stats",
]
