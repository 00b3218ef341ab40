"""Measure what a positional patch did: perplexity (per document, strided, by position), passkey
and needle retrieval, their tables (`hf_posenc.eval.report`) and figures (`hf_posenc.eval.plots`, needs matplotlib).

    from hf_posenc import eval as hpe
    curve = hpe.perplexity_curve(model, docs, length=16384)   # docs: token ids, e.g. data.tokenize(...)
    hpe.perplexity_by_length(model, docs, [2048, 4096, 8192, 16384])
    trials = hpe.make_trials("passkey", tokenizer, lengths=[4096, 16384], depths=[0.1, 0.5, 0.9])
    hpe.summarize(trials, hpe.score_trials(model, trials))
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
from .retrieval import TASKS, Haystack, Trial, build_trial, make_trials, score_trials, summarize
from .variants import expand_grid, parse_variant, variant, variant_params

__all__ = [
    "token_nll", "document_perplexity", "perplexity_by_length", "strided_perplexity", "perplexity_curve", "curve_perplexity",
    "is_length_dependent", "TASKS", "Trial", "Haystack", "build_trial", "make_trials", "score_trials", "summarize",
    "parse_variant", "expand_grid", "variant_params", "variant",
]
