"""What every plot writes: a PNG, the numbers behind it as CSV, and what they mean as JSON.

matplotlib is optional (the "plot" extra): it is imported here, lazily, by the functions that draw,
and through its object-oriented API on an Agg canvas, so no pyplot state or global backend changes."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

INSTALL_HINT = "pip install 'hf_posenc[plot]' (or: pip install matplotlib)"


def require_matplotlib() -> None:
    """Raise a clear ImportError when matplotlib is missing (before any long computation)."""
    new_figure(1, 1)


def new_figure(width: float, height: float):
    """A matplotlib Figure on an Agg canvas, or a clear ImportError when matplotlib is missing."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as err:
        raise ImportError(f"hf_posenc's plots need matplotlib, which is not installed; {INSTALL_HINT}") from err
    figure = Figure(figsize=(width, height), dpi=100, layout="constrained")
    FigureCanvasAgg(figure)
    return figure


@dataclass
class PlotResult:
    """The files one plot wrote (`png`, `csv`, `json`) and the numbers it drew (`data`: column -> values,
    the same as the CSV; `info`: the same as the JSON)."""

    png: Path
    csv: Path
    json: Path
    data: dict[str, np.ndarray] = field(repr=False)
    info: dict = field(repr=False)


def _array(values) -> np.ndarray:
    if isinstance(values, torch.Tensor):
        values = values.detach().to("cpu", torch.float64).numpy()
    return np.asarray(values, dtype=np.float64)


def write(figure, out: str | Path, name: str, data: dict, info: dict) -> PlotResult:
    """Save `figure` as out/name.png, the columns of `data` as out/name.csv (shorter columns padded
    with empty cells), `info` as out/name.json; close nothing (the figure is not registered anywhere)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    columns = {key: _array(value).reshape(-1) for key, value in data.items()}
    rows = max((len(c) for c in columns.values()), default=0)
    csv_path = out / f"{name}.csv"
    with csv_path.open("w", encoding="utf-8") as handle:
        handle.write(",".join(columns) + "\n")
        for r in range(rows):
            handle.write(",".join(_cell(c, r) for c in columns.values()) + "\n")
    json_path = out / f"{name}.json"
    json_path.write_text(json.dumps(_plain(info), indent=2) + "\n", encoding="utf-8")
    png_path = out / f"{name}.png"
    figure.savefig(png_path)
    return PlotResult(png=png_path, csv=csv_path, json=json_path, data=columns, info=info)


def _cell(column: np.ndarray, row: int) -> str:
    if row >= len(column) or math.isnan(column[row]):
        return ""
    return repr(float(column[row]))  # shortest text that reads back to the same float64


def _plain(value):
    """JSON-ready: tensors and numpy values to lists and numbers, NaN to None."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, (torch.Tensor, np.ndarray)):
        return _plain(_array(value).tolist())
    if isinstance(value, (np.floating, float)):
        return None if math.isnan(value) else float(value)
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, Path):
        return str(value)
    return value


def read_csv(path: str | Path) -> dict[str, np.ndarray]:
    """The columns of a CSV that `write` made (empty cells read as NaN)."""
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    header = lines[0].split(",")
    values = [[float(cell) if cell else math.nan for cell in line.split(",")] for line in lines[1:]]
    table = np.array(values, dtype=np.float64).reshape(len(values), len(header))
    return {name: table[:, i] for i, name in enumerate(header)}


def log_bins(values: np.ndarray, first: int = 1, per_decade: int = 12) -> tuple[np.ndarray, np.ndarray]:
    """Means of values[d] over log-spaced bins of d >= first, and the geometric centre of each bin:
    what a log-x axis can show of a long, oscillating series (the CSV keeps every value)."""
    n = len(values)
    if n <= first:
        return np.empty(0), np.empty(0)
    count = max(2, int(per_decade * math.log10(n / first)) + 1)
    edges = np.unique(np.round(np.logspace(math.log10(first), math.log10(n), count)).astype(int))
    centres, means = [], []
    for low, high in zip(edges[:-1], edges[1:]):
        chunk = values[low:high]
        chunk = chunk[~np.isnan(chunk)]
        if len(chunk):
            centres.append(math.sqrt(low * max(high - 1, low)))
            means.append(chunk.mean())
    return np.array(centres), np.array(means)
