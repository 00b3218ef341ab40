"""Local `evaluate` modules (the hub's own `evaluate.load("perplexity")` needs the network):

    import hf_posenc.metrics
    ppl = hf_posenc.metrics.load("perplexity")     # = evaluate.load(hf_posenc.metrics.path("perplexity"))
    ppl.compute(predictions=texts, model_id="smollm2", variant="yarn", max_position_embeddings=16384)
"""

from __future__ import annotations

from pathlib import Path

from ..errors import InvalidParameterError

NAMES = ("perplexity",)


def path(name: str = "perplexity") -> Path:
    """The folder `evaluate.load` takes for the local module `name`."""
    if name not in NAMES:
        raise InvalidParameterError(f"no local metric {name!r}; available: {', '.join(NAMES)}")
    return Path(__file__).parent / name


def load(name: str = "perplexity", **kwargs):
    import evaluate

    return evaluate.load(str(path(name)), **kwargs)
