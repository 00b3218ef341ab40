"""The tables and figures of an evaluation, drawn from its results: `recipes/evaluate.py` writes them as
summary.md and PNGs, benchmarks/bench_eval_quality.py prints the same tables per play. Tables are
markdown lines; figures go through `hf_posenc.eval.plots` (matplotlib, imported only to draw)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

from .perplexity import curve_perplexity
from .retrieval import KINDS
from .variants import NONE

FRAMING_NOTE = {"bos": "bos (each document, window and prompt starts with the tokenizer's BOS token, as the model "
                       "sees an input; the BOS is context, never scored).",
                "none": "none (documents, windows and prompts are scored as tokenized, with no BOS before them)."}


def number(x: float) -> str:
    """Three significant digits; "-" for a measure that is not a number."""
    return f"{x:.3g}" if x == x else "-"


def table(header: Sequence, rows: Iterable[Sequence]) -> list[str]:
    """A markdown table as lines: the header, the rule, one line per row."""
    return ["| " + " | ".join(map(str, header)) + " |", "|" + "---|" * len(header),
            *("| " + " | ".join(map(str, row)) + " |" for row in rows)]


def length_table(rows: dict[str, dict], *, digits=number, label: str = "variant") -> list[str]:
    """Perplexity against context length, one row per variant (`perplexity_by_length` results, all at the
    same lengths), and whether one pass gave every length."""
    lengths = next(iter(rows.values()))["lengths"]
    return table([label, *lengths, "how"],
                 ([name, *map(digits, r["perplexity"]), "one pass" if r["one_pass"] else "a pass per length"]
                  for name, r in rows.items()))


def retrieval_table(runs: dict[str, dict], *, label: str = "variant") -> list[str]:
    """Retrieval accuracy at each length, one row per variant (`summarize` results), and the mean
    log-probability of the answer."""
    lengths = next(iter(runs.values()))["lengths"]
    return table([label, *lengths, "mean answer log-prob"],
                 ([name, *(f"{a:.2f}" for a in r["by_length"]), f"{r['mean_logprob']:.2f}"] for name, r in runs.items()))


def variant_label(label: str, variant: dict) -> str:
    """A variant's name in tables and figures: its method and target ("yarn -> 16k")."""
    target = (variant.get("params") or {}).get("max_position_embeddings")
    if label == NONE or "@" in label or not target:
        return label
    return f"{label} -> {target / 1024:g}k" if target >= 1024 else f"{label} -> {target}"


def summary(results: dict, context: int) -> str:
    """summary.md of `recipes/evaluate.py`: perplexity against length, grids, perplexity inside and past the
    original context (`context` tokens), sliding window, retrieval."""
    variants, machine, config = results["variants"], results["machine"], results["config"]
    shown = {label: variant_label(label, v) for label, v in variants.items()}
    lines = [f"# {config['model']['name']}: positional variants", "",
             f"{machine['date']}, {machine['device']} ({machine['platform']}), torch {machine['torch']}, "
             f"transformers {machine['transformers']}, {results.get('dtype', {}).get('used', config['model']['dtype'])}; "
             f"original context {context}.", "",
             f"Framing: {FRAMING_NOTE[results.get('framing', 'none')]}", ""]
    lengths = {shown[k]: v["lengths"] for k, v in variants.items() if "lengths" in v}
    if lengths:
        first = next(iter(lengths.values()))
        lines += [f"Perplexity against context length: each of {first['documents']} document(s) truncated to n tokens, "
                  f"scored in one pass (token-weighted over the documents; corpus {config['data']['corpus']}):", "",
                  *length_table(lengths), ""]
    for label, grid in results.get("grid", {}).items():
        lines += [f"Grid {label}: perplexity at {grid['length']} tokens on {grid['documents']} tuning document(s) "
                  f"(the best is evaluated above on held-out documents as '(grid best)'):", "",
                  *table(["point", "perplexity"], ([p["variant"] + (" **best**" if p["variant"] == grid["best"] else ""),
                                                   number(p["perplexity"])]
                                                  for p in sorted(grid["points"], key=lambda p: p["perplexity"]))),
                  "", f"Best: `{grid['patch']}`", ""]
    curves = {k: v["curve"] for k, v in variants.items() if "curve" in v}
    if curves:
        first = next(iter(curves.values()))
        lines += [f"Perplexity by position ({first['length']} tokens, {first['documents']} document(s), "
                  f"corpus {config['data']['corpus']}):", "",
                  *table(["variant", f"positions < {context}", f"positions >= {context}", "last bucket", "this measure (s)"],
                         ([shown[k], number(curve_perplexity(c, 0, context)), number(curve_perplexity(c, context)),
                           number(c["perplexity"][-1]), variants[k].get("seconds_by_measure", {}).get("curve", "-")]
                          for k, c in curves.items())), ""]
    strided = {k: v["strided"] for k, v in variants.items() if "strided" in v}
    if strided:
        windows = list(next(iter(strided.values())))
        lines += ["Sliding-window perplexity (window = context the model sees):", "",
                  *table(["variant", *(f"window {w}" for w in windows)],
                         ([shown[k], *(number(s[w]["perplexity"]) for w in windows)] for k, s in strided.items())), ""]
    for task in KINDS:
        runs = {shown[k]: v[task] for k, v in variants.items() if task in v}
        if runs:
            first = next(iter(runs.values()))
            lines += [f"{task} accuracy at each length ({first['trials'] // len(first['lengths'])} trials per length, "
                      f"depths {first['depths']}):", "", *retrieval_table(runs), ""]
    lines += recall_lines(variants, shown) + task_lines(variants, shown)
    return "\n".join(lines)


def recall_lines(variants: dict, shown: dict) -> list[str]:
    """Recall at a distance: per variant and length the gap with its 95 % interval and n, which form (control
    pass or one pass), the recall distance, the gap by distance bin."""
    from .stats import interval_text

    rows = [(shown[k], length, c) for k, v in variants.items() for length, c in v.get("recall", {}).items()]
    if not rows:
        return []
    out = ["Recall at a distance: the repeat's loss without its first copy minus with it (nats / token, mean of "
           "the passages, 95 % bootstrap interval); recall distance: the last distance bin whose gap stays above "
           "half the shortest bin's ('+': every bin measured does):", "",
           *table(["variant", "length", "gap", "form", "recall distance", "by distance"],
                  ([name, length, interval_text(c["gap"]), c["form"],
                    "-" if c["recall_distance"] is None else f"{c['recall_distance']}{'+' if c['beyond_measured'] else ''}",
                    ", ".join(f"<{b['end']}: {b['mean']:.2f} (n {b['n']})" for b in c["bins"])]
                   for name, length, c in rows)), ""]
    return out


# how a cell's probes ran (`probes.score_probes`'s "prefill"), as summary.md says it
PREFILL_TEXT = {"shared": "shared", "one probe": "one probe", "fell back": "fell back: a full pass per probe",
                "not shared": "a full pass per probe"}


def prefill_text(cell: dict) -> str:
    """A task cell's prefill column; a cell of an older run says only whether it was shared."""
    said = cell.get("prefill") or ("shared" if cell["shared"] else "not shared")
    return " / ".join(PREFILL_TEXT.get(part, part) for part in said.split(" / "))


def task_lines(variants: dict, shown: dict) -> list[str]:
    """Retrieval families: per variant, family and length the accuracy with its Wilson interval and n, the mean
    answer log-prob with its interval, and whether the probes shared one prefill; the effective length."""
    from .stats import interval_text, share_text

    rows = [(shown[k], family, length, c, v["tasks"][family])
            for k, v in variants.items() for family in v.get("tasks", {})
            for length, c in v["tasks"][family]["cells"].items()]
    if not rows:
        return []
    return ["Retrieval families (RULER's; found = greedy decoding gives the whole answer; accuracy with its Wilson "
            "95 % interval; effective length: the longest length up to which accuracy stays above the threshold):",
            "", *table(["variant", "family", "length", "found", "answer log-prob", "prefill", "effective length"],
                       ([name, family, length, share_text(c), interval_text(c["logprob"]),
                         prefill_text(c),
                         f"{f['effective_length'] or '-'} (> {f['threshold']:.2f})"]
                        for name, family, length, c, f in rows)), ""]


def figures(results: dict, out: str | Path, context: int) -> list[Path]:
    """The figures of `recipes/evaluate.py` into `out`: perplexity_by_length.png, perplexity_curve.png,
    and per retrieval task <task>.png (accuracy against length) and <task>_depths.png (depth x length)."""
    from . import plots

    out, written = Path(out), []
    variants, model = results["variants"], Path(results["config"]["model"]["name"]).name
    lengths = {variant_label(k, v): v["lengths"] for k, v in variants.items() if "lengths" in v}
    if lengths:
        written.append(plots.plot_perplexity_by_length(lengths, out / "perplexity_by_length.png", original_context=context,
                                                       title=f"{model}: perplexity against context length"))
    curves = {variant_label(k, v): v["curve"] for k, v in variants.items() if "curve" in v}
    if curves:
        written.append(plots.plot_perplexity_curves(curves, out / "perplexity_curve.png", original_context=context,
                                                    title=f"{model}: perplexity by position"))
    for task in KINDS:
        runs = {variant_label(k, v): v[task] for k, v in variants.items() if task in v}
        if runs:
            written.append(plots.plot_retrieval_by_length(runs, out / f"{task}.png", original_context=context,
                                                          title=f"{model}: {task} accuracy"))
            written.append(plots.plot_retrieval_depths(runs, out / f"{task}_depths.png", title=f"{model}: {task} accuracy"))
    recall = {f"{variant_label(k, v)} @{int(n) / 1024:g}k": c for k, v in variants.items()
              for n, c in v.get("recall", {}).items()}
    if recall:
        written.append(plots.plot_recall(recall, out / "recall.png", original_context=context,
                                         title=f"{model}: recall at a distance"))
    tasks = {f"{variant_label(k, v)} {family}": {int(n): c for n, c in t["cells"].items()}
             for k, v in variants.items() for family, t in v.get("tasks", {}).items()}
    if tasks:
        written.append(plots.plot_accuracy_by_length(tasks, out / "tasks.png", original_context=context,
                                                     title=f"{model}: retrieval families"))
    return written


def written_line(out: str | Path, figures: Sequence[Path] = ()) -> str:
    """The last line of an evaluation: where its results, summary and figures are."""
    out = Path(out)
    names = ", ".join(Path(f).name for f in figures)
    return (f"wrote {out / 'results.json'} and {out / 'summary.md'}"
            + (f"; figures in {out}/: {names}" if figures else "; no figures (plots: false)"))
