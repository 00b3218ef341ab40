"""Look inside a model's positional mechanism: plots (PNG, with the numbers as CSV and JSON beside each)
and checks that return numbers.

    from hf_posenc import analysis
    analysis.plot(model, "wavelengths", "plots/", max_position_embeddings=16384)
    analysis.check_relative(model)      # 0 for RoPE, large for a learned table

Plots (one module per kind): `plot_table` and `plot_similarity` (tables.py: learned, sinusoidal,
fitted and interpolated position tables), `plot_wavelengths` and `plot_decay` (rope.py: RoPE
models, per scaling method), `plot_attention` (attention.py: a real model on a real text, before
and after a patch). Checks (checks.py): `check_relative`, `check_rotation`.

matplotlib is needed only to draw (`pip install 'hf_posenc[plot]'`); the checks and the numbers
(`position_table`, `similarity_profile`, `rope_frequencies`, `expected_score`,
`attention_profile`) work without it."""

from __future__ import annotations

from pathlib import Path

import torch

from ..errors import InvalidParameterError
from ._model import contexts, mechanism, position_table
from ._output import PlotResult, read_csv
from .attention import attention_profile, plot_attention
from .checks import RotationFit, check_relative, check_rotation, rotation_fit, toeplitz_residual
from .rope import RopeFrequencies, expected_score, plot_decay, plot_wavelengths, rope_frequencies
from .tables import plot_similarity, plot_table, similarity_profile

PLOTS = {
    "table": plot_table,
    "similarity": plot_similarity,
    "wavelengths": plot_wavelengths,
    "decay": plot_decay,
    "attention": plot_attention,
}
# The plots that apply to each mechanism, in the order `what="all"` draws them.
PLOTS_FOR = {"learned": ("table", "similarity", "attention"), "rope": ("wavelengths", "decay", "attention")}


def plots_for(model: torch.nn.Module) -> tuple[str, ...]:
    """The plots that apply to `model`'s positional mechanism."""
    return PLOTS_FOR[mechanism(model)]


def plot(model: torch.nn.Module, what: str, out: str | Path, **kwargs) -> PlotResult:
    """Draw one plot by name (see PLOTS); `kwargs` go to its function (`ids=` for "attention")."""
    if what not in PLOTS:
        raise InvalidParameterError(f"unknown plot {what!r}; known: {', '.join(PLOTS)}")
    if what == "attention":
        return plot_attention(model, kwargs.pop("ids"), out, **kwargs)
    return PLOTS[what](model, out, **kwargs)


__all__ = [
    "plot", "plots_for", "PLOTS", "PlotResult", "read_csv",
    "plot_table", "plot_similarity", "plot_wavelengths", "plot_decay", "plot_attention",
    "position_table", "similarity_profile", "rope_frequencies", "RopeFrequencies", "expected_score",
    "attention_profile", "contexts", "mechanism",
    "check_relative", "check_rotation", "rotation_fit", "RotationFit", "toeplitz_residual",
]
