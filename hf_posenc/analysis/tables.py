"""Absolute position tables (learned, sinusoidal, fitted, interpolated): the table as a heat map, and
the similarity of two position vectors against their distance."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import torch

from ..errors import InvalidParameterError
from ..record_reader import read_record
from ..registry import find_family
from . import _model
from ._model import position_table
from ._output import PlotResult, new_figure, write
from .checks import check_relative, check_rotation

MEASURES = ("cosine", "dot")

# The tables plot_similarity compares, each built from the model's own table by a temporary patch:
# name -> (method, parameters, label). "model" is the model's table as it is.
VARIANTS: dict[str, tuple[str | None, dict, str]] = {
    "model": (None, {}, "the model's table"),
    "sinusoidal": ("sinusoidal", {"init": "raw"}, "sinusoidal (Vaswani et al.)"),
    "scaled": ("sinusoidal", {"init": "scaled"}, "sinusoidal, scaled to the table's RMS"),
    "fit": ("sinusoidal", {"init": "fit"}, "sinusoidal fitted to the table"),
    "interpolate": ("interpolate", {}, "table interpolated"),
    "tile": ("tile", {}, "table tiled"),
}
DEFAULT_VARIANTS = ("model", "sinusoidal", "fit", "interpolate")


def similarity_profile(table: torch.Tensor, measure: str = "cosine") -> dict[str, torch.Tensor]:
    """For each distance k = 0..len(table)-1, over the pairs (table[pos], table[pos + k]): the mean, std,
    min and max of their similarity, the cosine or the dot product. {"mean": ..., "std": ..., ...}"""
    if measure not in MEASURES:
        raise InvalidParameterError(f"measure must be one of {list(MEASURES)}, got {measure!r}")
    table = torch.as_tensor(table).to(torch.float64)
    if table.ndim != 2:
        raise InvalidParameterError(f"a position table is 2-D (positions, dim), got shape {tuple(table.shape)}")
    if measure == "cosine":
        table = table / table.norm(dim=1, keepdim=True).clamp_min(1e-30)
    scores = table @ table.T
    diagonals = [scores.diagonal(k) for k in range(len(table))]
    return {
        "mean": torch.stack([d.mean() for d in diagonals]),
        "std": torch.stack([d.std(correction=0) for d in diagonals]),
        "min": torch.stack([d.min() for d in diagonals]),
        "max": torch.stack([d.max() for d in diagonals]),
    }


def _source_tables(source, what: str) -> tuple[torch.nn.Module | None, dict[str, torch.Tensor]]:
    if isinstance(source, Mapping):
        return None, {str(k): torch.as_tensor(v).detach().to("cpu", torch.float64) for k, v in source.items()}
    if isinstance(source, torch.Tensor):
        return None, {"table": source.detach().to("cpu", torch.float64)}
    if isinstance(source, torch.nn.Module):
        return source, {}
    raise TypeError(f"the {what} plot takes a model, a 2-D tensor or a dict of them, got {type(source).__name__}")


def _model_label(model: torch.nn.Module | None) -> str:
    if model is None:
        return "given tables"
    record = read_record(model.config)
    kind = find_family(model).describe(model)["mechanism"]
    suffix = f", patched: {record.method}" if record else ""
    return f"{model.config.model_type} ({kind}{suffix})"


def plot_table(source, out: str | Path, *, method: str | None = None, positions: int | None = None,
               original: int | None = None, name: str | None = None, **params) -> PlotResult:
    """The position table as a heat map, positions (down) x dimensions (across), the original context
    marked. `source` is a learned-position model (patched or not) or a 2-D tensor (then `original`
    marks the context). `method` (with its parameters, target context 2x the original by default)
    patches the model for the plot and unpatches it after. Writes out/table[-method].png/.csv/.json;
    the CSV holds every value: a `position` column, then `dim_0`, `dim_1`, ..."""
    model, tables = _source_tables(source, "table")
    name = name or ("table" if method is None else f"table-{method}")
    if model is not None:
        base_original, _ = _model.contexts(model)
        original = original or base_original
        with _model.patched(model, method, _model.target_params(params, base_original), "table"):
            table = position_table(model, positions)
            label, current = _model_label(model), _model.contexts(model)[1]
        model_type = model.config.model_type
    else:
        table = next(iter(tables.values()))[: positions or None]
        label = "a tensor" if isinstance(source, torch.Tensor) else repr(next(iter(tables)))
        current, model_type = len(table), None
    if table.ndim != 2:
        raise InvalidParameterError(f"a position table is 2-D (positions, dim), got shape {tuple(table.shape)}")
    n, dim = table.shape
    values = table.numpy()
    figure = new_figure(7.5, 5.5)
    ax = figure.add_subplot()
    limit = float(np.quantile(np.abs(values), 0.995)) or 1.0  # a few outlier rows (BERT's position 0) would wash it out
    # "antialiased": a table taller or wider than the axes' pixels is averaged down, not sampled
    image = ax.imshow(values, aspect="auto", cmap="RdBu_r", vmin=-limit, vmax=limit, interpolation="antialiased",
                      extent=(-0.5, dim - 0.5, n - 0.5, -0.5))
    figure.colorbar(image, ax=ax, label="value (colour clipped at the 99.5th percentile of |value|)", shrink=0.9)
    if original is not None and original < n:
        ax.axhline(original - 0.5, color="black", lw=1.5, ls="--")
        ax.text(dim - 0.5, original - 0.5, f" original context: {original} ", ha="right", va="bottom",
                fontsize=9, color="black", backgroundcolor=(1, 1, 1, 0.7))
    ax.set_xlabel("dimension")
    ax.set_ylabel("position")
    whole = " (all inside the original context)" if original is not None and original >= n else ""
    ax.set_title(f"Position table of {label}\n{n} positions x {dim} dimensions{whole}")
    data = {"position": np.arange(n), **{f"dim_{j}": values[:, j] for j in range(dim)}}
    info = {"what": "table", "label": label, "model_type": model_type, "method": method, "params": params,
            "positions": n, "dim": dim, "original_context": original, "current_context": current,
            "colour_limit": limit, "check_relative": check_relative(table), "check_rotation": check_rotation(table),
            "csv": "position, then one column per dimension: the table's value"}
    return write(figure, out, name, data, info)


def _variant_tables(model: torch.nn.Module, variants: Sequence[str], params: dict) -> dict[str, tuple]:
    """{variant: (label, table)} for a learned-position model."""
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        raise InvalidParameterError(f"unknown similarity variant(s) {unknown}; known: {', '.join(VARIANTS)}")
    original, _ = _model.contexts(model)
    tables = {}
    for variant in variants:
        method, extra, label = VARIANTS[variant]
        if variant == "model":
            record = read_record(model.config)
            kind = find_family(model).describe(model)["mechanism"]
            label = f"the model's table ({record.method})" if record else f"the model's {kind} table"
        with _model.patched(model, method, {**_model.target_params(params, original), **extra}, "similarity"):
            table = position_table(model)
        tables[variant] = (f"{label}, {len(table)} positions", table)
    return tables


def plot_similarity(source, out: str | Path, *, variants: Sequence[str] = DEFAULT_VARIANTS, measure: str = "cosine",
                    original: int | None = None, name: str = "similarity", **params) -> PlotResult:
    """The similarity (cosine or dot) of two position vectors against their distance, one panel per table:
    the mean over all pairs (pos, pos + distance), and the band from the lowest to the highest pair.

    `source` is a learned-position model or a dict {name: 2-D tensor}. For a model, `variants` picks
    the tables, each built from the model's own table by a temporary patch to the target context
    (max_position_embeddings= or factor=, default 2x the original): "model" (its table as it is),
    "sinusoidal" (the formula of Vaswani et al. 2017), "scaled", "fit" (the sinusoid fitted to the table), "interpolate",
    "tile". The model's own learned table stops at its context. Writes out/similarity.png/.csv/.json;
    the CSV has a `distance` column, then `<variant>: mean|std|min|max` per table."""
    if measure not in MEASURES:
        raise InvalidParameterError(f"measure must be one of {list(MEASURES)}, got {measure!r}")
    model, given = _source_tables(source, "similarity")
    if model is not None:
        original = original or _model.contexts(model)[0]
        tables = _variant_tables(model, variants, params)
    else:
        tables = {key: (f"{key}, {len(t)} positions", t) for key, t in given.items()}
    profiles = {key: similarity_profile(table, measure) for key, (_, table) in tables.items()}
    longest = max(len(table) for _, table in tables.values())
    figure = new_figure(3.3 * len(tables) + 0.7, 4.0)
    axes = figure.subplots(1, len(tables), sharey=True, squeeze=False)[0]
    for ax, (key, profile) in zip(axes, profiles.items()):
        distance = np.arange(len(profile["mean"]))
        ax.fill_between(distance, profile["min"].numpy(), profile["max"].numpy(), color="tab:blue", alpha=0.2, lw=0,
                        label="lowest to highest pair")
        ax.plot(distance, profile["mean"].numpy(), color="tab:blue", lw=1.2, label="mean over pairs")
        if original is not None:
            ax.axvline(original, color="black", ls="--", lw=1, label=f"original context ({original})")
        ax.axhline(0, color="grey", lw=0.5)
        ax.set_xlim(0, longest)
        ax.set_title(tables[key][0], fontsize=9)
        ax.set_xlabel("distance |m - n| (positions)")
    axes[0].set_ylabel(f"{measure} of PE(m) and PE(n)")
    axes[-1].legend(fontsize=8, loc="upper right")
    figure.suptitle(f"Similarity of two position vectors against their distance: {_model_label(model)}")
    data = {"distance": np.arange(longest)}
    for key, profile in profiles.items():
        data |= {f"{key}: {stat}": values for stat, values in profile.items()}
    info = {"what": "similarity", "measure": measure, "model_type": getattr(getattr(model, "config", None),
                                                                            "model_type", None),
            "tables": {key: {"label": label, "positions": len(table)} for key, (label, table) in tables.items()},
            "original_context": original, "params": params,
            "csv": "distance, then per table the mean, std, min and max over the pairs (pos, pos + distance)"}
    return write(figure, out, name, data, info)
