"""A search for RoPE's per-pair rescale factors (LongRoPE, Ding et al. 2024; LongRoPE2, Shang et al. 2025), saved
as a stock `longrope` config that transformers, vLLM and llama.cpp run.

One factor per rotary pair, lambda_i (pair 0 turns fastest): the pair's frequency is divided by lambda_i past the
original context. LongRoPE searches the whole vector; on a CPU, where a candidate costs a long forward pass, this
searches a low-dimensional form of it that holds the constraints by construction (every factor >= 1, non-decreasing
toward the slow pairs) and contains the closed forms' shapes:

    lambda_i = top ** r_i,   r_i = clip((i - start) / width, 0, 1) ** shape

pairs up to `start` keep their frequency (the critical dimension: they turn often enough inside the original
context to have seen every rotation), the slowest reach `top` (a multiple of the factor s); NTK is start 0, width
the whole, shape 1, top s; PI a step at 0. The attention factor (the scale on cos and sin) is a fifth dimension,
optionally.

Fitness, LongRoPE2's "needle-driven" loss: recall at a distance (hf_posenc/eval/recall.py) on a tuning text, the
mean loss of the repeated passages whose first copy lies at least `far_from` tokens back: tokens only far context
predicts. One pass a sequence, no control pass: a candidate that damages the model raises this loss too, where a
gap against a control would forgive it. Guard: perplexity of the first `guard_length` tokens of the text (inside
the original context); a candidate that raises it by more than `guard_share` is rejected before its long pass.

Optimizer: CMA-ES (Hansen 2016) from the `cmaes` package, started from the best of the seeds (the closed forms PI,
NTK, YaRN, llama3 and the ramp, each evaluated with its exact factors, then projected into the form). CMA-ES
ranks candidates only, so the guard's rejections rank last by how far they missed; `cmaes` is a small numpy
library whose ask/tell loop replays a search exactly from its seed, which is how a killed search resumes.

    space = FactorSpace(pairs=32, factor=2.0)
    run = FactorSearch(model, tokenizer, text, target=16384, out="runs/search", budget=24)
    best = run.run()          # every candidate appended to out/candidates.jsonl as it completes
    method, params = best_method(best, target=16384, original=8192)   # hp.patch(model, method, **params)

The parts: `factors.py` (the searched form of the factors, the closed forms it starts from, the stock method a
best saves as), `record.py` (what makes two searches the same, the record a killed search resumes from, one search
a folder), `factor_search.py` (the candidates scored: the guard, the long pass, CMA-ES, the convergence figure).
"""

from .factor_search import REJECTED, FactorSearch, convergence_figure, time_left
from .factors import (MODES, SEED_NAMES, SEEDS, FactorSpace, best_method, closed_forms, critical_pair, longrope_params,
                      rotary_module)
from .record import OUTPUTS, SearchSettings, only_search, read_candidates, read_search, resume_record, write_whole

__all__ = ["FactorSearch", "SearchSettings", "FactorSpace", "best_method", "closed_forms", "critical_pair",
           "longrope_params", "rotary_module", "read_candidates", "read_search", "resume_record", "only_search",
           "write_whole", "convergence_figure", "time_left", "SEEDS", "SEED_NAMES", "MODES", "OUTPUTS", "REJECTED"]
