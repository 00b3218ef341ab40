"""Figures of an evaluation: perplexity by position, retrieval accuracy by length and by depth.
Each takes results keyed by variant ("none", "yarn", ...) and writes one PNG (matplotlib's object
API: no pyplot state, no backend to set)."""

from __future__ import annotations

import math
from pathlib import Path

from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, NullLocator


def _context_line(ax, original_context: int | None, xs) -> None:
    """Mark the original context where it falls among the data; a line past them would stretch the axis
    (a 32k model read at 2k-4k: every point squeezed into the left few percent). The label sits at the
    bottom, clear of a legend in the upper corner."""
    xs = [x for x in xs if x is not None]
    if original_context and xs and min(xs) <= original_context <= max(xs):
        ax.axvline(original_context, color="0.5", linestyle=":", linewidth=1)
        ax.annotate("original context", (original_context, 0), xycoords=("data", "axes fraction"),
                    xytext=(3, 4), textcoords="offset points", fontsize=8, color="0.4")


def _clip(ax, results: dict[str, dict], reference: str) -> None:
    """The perplexity axis up to the variants other than `reference`; its points above that, in words."""
    others = [p for label, res in results.items() if label != reference for p in res["perplexity"]]
    if not others:
        return
    top = 1.12 * max(others)
    ax.set_ylim(0.95 * min(p for res in results.values() for p in res["perplexity"]), top)
    above = [f"{label}: {p:.0f} at {n / 1024:g}k" for label, res in results.items() if label == reference
             for n, p in zip(res["lengths"], res["perplexity"]) if p > top]
    if above:
        ax.text(0.02, 0.97, "above the axis: " + ", ".join(above), transform=ax.transAxes, fontsize=8, va="top")


def _save(fig: Figure, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100, bbox_inches="tight")
    return path


def plot_perplexity_curves(curves: dict[str, dict], path: str | Path, *, original_context: int | None = None,
                           title: str = "perplexity by position", reference: str | None = "none") -> Path:
    """One line per variant: perplexity (log scale) of each bucket of positions. When the curves include
    `reference` (the unpatched model), a second panel shows each one's ratio to it: what the text does
    to every variant alike cancels out, what the patch does remains."""
    ratio = reference in curves and len(curves) > 1
    fig = Figure(figsize=(8, 6.4 if ratio else 4.2), layout="constrained")
    axes = fig.subplots(2 if ratio else 1, 1, sharex=True, squeeze=False, height_ratios=[3, 2] if ratio else None)[:, 0]
    plain = FuncFormatter(lambda value, _: f"{value:g}")  # 20, 30, 50 rather than 2x10^1 ...
    for label, curve in curves.items():
        style = dict(marker=".", markersize=3, linewidth=1.2, label=label)
        axes[0].plot(curve["positions"], curve["perplexity"], **style)
        if ratio:
            base = curves[reference]["perplexity"]
            axes[1].plot(curve["positions"], [p / b for p, b in zip(curve["perplexity"], base)], **style)
    finite = [p for c in curves.values() for p in c["perplexity"] if math.isfinite(p)]
    if finite and max(finite) > 50 * min(finite):  # a collapsed variant would flatten the others
        axes[0].set_ylim(min(finite) * 0.9, min(max(finite), 50 * min(finite)))
    axes[0].set(ylabel="perplexity", title=title)
    if ratio:
        axes[1].set(ylabel=f"ratio to {reference}")
    for ax in axes:
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(plain)
        ax.yaxis.set_minor_formatter(plain)
        ax.grid(alpha=0.3, which="both")
        _context_line(ax, original_context, [x for c in curves.values() for x in c["positions"]])
    axes[-1].set_xlabel("position (tokens)")
    axes[0].legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))
    return _save(fig, path)


def plot_perplexity_by_length(results: dict[str, dict], path: str | Path, *, original_context: int | None = None,
                              title: str = "perplexity against context length", reference: str = "none",
                              clip_reference: bool = False) -> Path:
    """One line per variant: the perplexity of the documents truncated to each length
    (`perplexity_by_length` results), both axes logarithmic, the unpatched model dashed. `clip_reference`:
    the perplexity axis fits the other variants, and the reference's points above it are written on the
    figure (an unpatched model at 4x its context would squeeze every patched variant into a sliver)."""
    return plot_perplexity_by_length_panels({"": results}, path, original_context=original_context, title=title,
                                            reference=reference, clip_reference=clip_reference)


def plot_perplexity_by_length_panels(panels: dict[str, dict[str, dict]], path: str | Path, *,
                                     original_context: int | None = None, title: str = "perplexity against context length",
                                     reference: str = "none", clip_reference: bool = False) -> Path:
    """`plot_perplexity_by_length` side by side, one panel per {panel title: results} (e.g. one per
    document), sharing the perplexity axis."""
    fig = Figure(figsize=(7 if len(panels) == 1 else 4.2 * len(panels), 4.2), layout="constrained")
    axes = fig.subplots(1, len(panels), sharey=True, squeeze=False)[0]
    plain = FuncFormatter(lambda value, _: f"{value:g}")
    for ax, (name, results) in zip(axes, panels.items()):
        for label, res in results.items():
            ax.plot(res["lengths"], res["perplexity"], marker="o", markersize=4, linewidth=1.4, label=label,
                    linestyle="--" if label == reference else "-")
        lengths = sorted({n for res in results.values() for n in res["lengths"]})
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(lengths, [f"{n / 1024:g}k" if n >= 1024 else str(n) for n in lengths])
        ax.xaxis.set_minor_locator(NullLocator())
        ax.yaxis.set_major_formatter(plain)
        ax.yaxis.set_minor_formatter(plain)
        ax.grid(alpha=0.3, which="both")
        _context_line(ax, original_context, lengths)
        ax.set(xlabel="context length n (tokens)", title=name)
        if clip_reference:
            _clip(ax, results, reference)
    axes[0].set_ylabel("perplexity of the first n tokens")
    axes[-1].legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))
    if len(panels) == 1:
        axes[0].set_title(title)
    else:
        fig.suptitle(title, fontsize=10)
    return _save(fig, path)


def plot_retrieval_by_length(results: dict[str, dict], path: str | Path, *, original_context: int | None = None,
                             title: str = "retrieval accuracy") -> Path:
    """One line per variant: accuracy (over depths and trials) at each context length."""
    fig = Figure(figsize=(7, 4.2))
    ax = fig.subplots()
    for label, res in results.items():
        ax.plot(res["lengths"], res["by_length"], marker="o", linewidth=1.2, label=label)
    _context_line(ax, original_context, [n for res in results.values() for n in res["lengths"]])
    ax.set(xlabel="context length (tokens)", ylabel="accuracy", title=title, ylim=(-0.05, 1.05))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))
    return _save(fig, path)


def plot_retrieval_depths(results: dict[str, dict], path: str | Path, *, title: str = "retrieval accuracy") -> Path:
    """One heatmap per variant: accuracy by depth of the hidden fact (rows) and length (columns)."""
    columns = min(len(results), 3)
    rows = math.ceil(len(results) / columns)
    fig = Figure(figsize=(3.4 * columns, 2.6 * rows + 0.4), layout="constrained")
    axes = fig.subplots(rows, columns, squeeze=False).ravel()
    for ax, (label, res) in zip(axes, results.items()):
        image = ax.imshow(res["accuracy"], vmin=0, vmax=1, cmap="RdYlGn", aspect="auto")
        ax.set_xticks(range(len(res["lengths"])), [f"{n // 1024}k" if n >= 1024 else str(n) for n in res["lengths"]],
                      fontsize=7)
        ax.set_yticks(range(len(res["depths"])), [f"{d:.0%}" for d in res["depths"]], fontsize=7)
        for (i, j), value in _cells(res["accuracy"]):
            ax.text(j, i, f"{value:.2g}", ha="center", va="center", fontsize=6)
        ax.set_title(label, fontsize=9)
    for ax in axes[len(results):]:
        ax.axis("off")
    fig.colorbar(image, ax=list(axes[:len(results)]), shrink=0.8, label="accuracy")
    fig.suptitle(f"{title} (rows: depth, columns: length)", fontsize=10)
    return _save(fig, path)


def _cells(grid):
    return [((i, j), v) for i, row in enumerate(grid) for j, v in enumerate(row)]


def plot_recall(variants: dict[str, dict], path: str | Path, *, original_context: int | None = None,
                title: str = "recall at a distance") -> Path:
    """One line per variant: the mean recall gap of each distance bin (hf_posenc.eval.recall.summarize_recall)
    with its 95 % bootstrap band, and each passage's gap as a faint dot. A gap near 0: the model gains nothing
    from the first copy that far back."""
    fig = Figure(figsize=(8, 4.4), layout="constrained")
    ax = fig.subplots()
    for i, (label, cell) in enumerate(variants.items()):
        colour = f"C{i % 10}"
        passages = cell.get("passages", [])
        ax.scatter([p["distance"] for p in passages], [p["gap"] for p in passages], s=5, alpha=0.25, color=colour)
        bins = [b for b in cell["bins"] if b["n"] > 0]
        # each bin's mean sits at its passages' mean distance (the bin's middle may hold none of them), its
        # interval as an error bar: a band needs two bins, a bar shows one
        xs = []
        for b in bins:
            inside = [p["distance"] for p in passages if b["start"] <= p["distance"] < b["end"]]
            xs.append(sum(inside) / len(inside) if inside else (b["start"] + b["end"]) / 2)
        means = [b["mean"] for b in bins]
        ax.plot(xs, means, marker="o", markersize=3, color=colour,
                label=f"{label}: {cell['gap']['mean']:.2f} ± {cell['gap']['half_width']:.2f} (n {cell['gap']['n']})")
        banded = [(x, b) for x, b in zip(xs, bins) if b["n"] > 1 and math.isfinite(b["low"])]
        if banded:
            ax.errorbar([x for x, _ in banded], [b["mean"] for _, b in banded],
                        yerr=[[b["mean"] - b["low"] for _, b in banded], [b["high"] - b["mean"] for _, b in banded]],
                        fmt="none", ecolor=colour, alpha=0.6, capsize=2, linewidth=1)
    ax.axhline(0, color="0.5", linewidth=0.8)
    _context_line(ax, original_context, [p["distance"] for c in variants.values() for p in c.get("passages", [])])
    ax.set(xlabel="distance from the first copy (tokens)", ylabel="recall gap (nats / token)", title=title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
    return _save(fig, path)


def plot_accuracy_by_length(cells: dict[str, dict[int, dict]], path: str | Path, *,
                            original_context: int | None = None, title: str = "retrieval accuracy") -> Path:
    """One line per (variant, family): accuracy at each length with its Wilson 95 % interval as error bars."""
    fig = Figure(figsize=(7, 4.2), layout="constrained")
    ax = fig.subplots()
    markers = "os^Dv<>p"
    for k, (label, by_length) in enumerate(cells.items()):
        lengths = sorted(by_length)
        acc = [by_length[n]["accuracy"] for n in lengths]
        err = [[a - by_length[n]["low"] for a, n in zip(acc, lengths)],
               [by_length[n]["high"] - a for a, n in zip(acc, lengths)]]
        # series that coincide (two variants at 0 or 1) would hide each other: each its own marker, open, and
        # nudged sideways by a few percent of a doubling
        nudge = 2 ** (0.04 * (k - (len(cells) - 1) / 2))
        ax.errorbar([n * nudge for n in lengths], acc, yerr=err, marker=markers[k % len(markers)],
                    fillstyle="none", capsize=3, label=label)
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v / 1024:g}k"))
    _context_line(ax, original_context, [n for c in cells.values() for n in c])
    ax.set(xlabel="context length (tokens)", ylabel="accuracy", ylim=(-0.03, 1.03), title=title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
    return _save(fig, path)
