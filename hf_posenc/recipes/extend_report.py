"""The last two stages of `hf-posenc extend` (hf_posenc/recipes/extend.py): the judge, which measures the extended
checkpoint against its untrained start and the training-free methods at the target on a held-out text, cell by
cell (judge/cells-HASH.json, one file a set of judge settings: a killed judge resumes at its cell, a judge
with other settings starts a file of its own); and the export, which puts the checkpoint at the run's
root with REPORT.md, the figure and the model card (README.md: the base model's hub id, no machine path). Every
function takes the run (extend.ExtendRun: its plan, args, folder and finished stages); extend.py imports this
module, never the other way."""

from __future__ import annotations

import json
import math
import shlex
import shutil
import time
from pathlib import Path

from hf_posenc.errors import ConfigError

# what the fine-tune's folder holds for its own run, not for the checkpoint's users
RUN_RECORDS = ("README.md", "finetune_config.json", "log.jsonl", "eval_before.json", "eval_after.json")
FIGURE = "recall_by_distance.png"


def format_value(value) -> str:
    if isinstance(value, float):
        return f"{value:g}"
    return "null" if value is None else str(value)


def write_json(path: Path, value) -> None:
    """Whole or not at all: a kill leaves the old file or the new one."""
    from hf_posenc.export.serving import whole_file   # torch loads with it: not at --help

    with whole_file(path) as fresh:
        fresh.write_text(json.dumps(value, indent=2))


# ------------------------------------------------------------------------------------------------ the judge
def cells_path(run) -> Path:
    """The judge's cells for this run's judge settings."""
    return cells_file(run.out, run.plan.record())


def cells_file(out: Path, settings: dict) -> Path:
    """Where a run in `out` keeps the judge's cells for its settings (the target and every judge.* setting)."""
    import hashlib

    keyed = {k: v for k, v in settings.items() if k.startswith("judge.") or k == "target"}
    key = hashlib.sha256(json.dumps(keyed, sort_keys=True).encode()).hexdigest()[:10]
    return out / "judge" / f"cells-{key}.json"


def check_texts(ref: str, needs: list) -> None:
    """Each text a stage still to run reads (extend.TextNeed) loads and holds the tokens it takes: refused now, not
    after the stages before it. The tokenizer only; the documents joined as the stages join them, a doubling prefix
    of them tokenized until there are enough."""
    import hf_posenc as hp
    from hf_posenc import corpora
    from hf_posenc.errors import PosEncError

    if not needs:
        return
    tokenizer = hp.load_tokenizer(ref)
    for need in needs:
        try:
            documents = list(corpora.load_corpus(need.spec)["text"])
        except (PosEncError, OSError, ValueError) as err:   # unreachable, unreadable: the loader's own words
            raise ConfigError(f"{need.field}: {err}") from None
        count, total = 1, 0
        while True:
            total = len(tokenizer("\n".join(documents[:count]), add_special_tokens=False)["input_ids"])
            if total >= need.tokens or count >= len(documents):
                break
            count *= 2
        if total < need.tokens:
            skip = ", or --judge.mode skip" if need.field == "judge.corpus" else ""
            raise ConfigError(f"{need.field} {need.spec!r} has {total} tokens, fewer than {need.what}: name a longer "
                              f"text{skip}")


def judge_passage(original: int) -> int:
    """Tokens of a judge's recall passage: 192, at most 1/32 of the original context (as the search's)."""
    return int(min(192, max(8, original // 32)))


def judge_layout(target: int, passages: int, passage: int, head: int, seed: int):
    """(layout, sequences) of a judge's recall cell: the passages' distances even over the whole window, so every bin
    holds its share (the halves layout puts few in the last quarter: 1 of 24 at 16k)."""
    from hf_posenc.eval import recall

    per_sequence, sequences = recall.cell_sequences(target, passages, passage)
    longest = target - head - passage
    distances = [int(passage + (j + 0.5) * (longest - passage) / per_sequence) for j in range(per_sequence)]
    return recall.plan_layout(target, passages=per_sequence, passage_tokens=passage, distances=distances, head=head,
                              seed=seed), sequences


def passages_words(run) -> str:
    """The judge's passages a seed as laid out: whole sequences, so a count that fills none evenly is rounded up."""
    from hf_posenc.eval import recall

    asked, v = run.plan.value("judge.passages"), run.plan.value
    per_sequence, sequences = recall.cell_sequences(v("target"), asked, judge_passage(run.plan.facts.original))
    laid = per_sequence * sequences
    return f"{laid} passages" + (f" ({asked} asked: whole sequences of {per_sequence})" if laid != asked else "")


def recall_cell(model, tokenizer, ids: list[int], prefix: list[int], settings: dict, original: int, seed: int) -> dict:
    """One recall cell of the judge: the passages of `seed` laid out over the target, scored with their control."""
    from hf_posenc.eval import recall

    T = settings["target"]
    layout, sequences = judge_layout(T, settings["judge.passages"], judge_passage(original), len(prefix), seed)
    sets = recall.make_recall(tokenizer, ids, layout, sequences=sequences, seed=seed, prefix=prefix)
    scored = recall.score_recall(model, sets, control=True)
    return recall.summarize_recall(scored, length=T, bin_width=settings["judge.bin"])


def wanted_cells(plan, row: str) -> list[str]:
    """The cells the judge measures of a row (`base`: the unpatched model) under the plan (extend.Plan)."""
    v = plan.value
    if row == "base":   # the unpatched model: the perplexity the extended one is held to inside its context
        return ["perplexity", "short_perplexity"]
    cells = [f"recall_seed{k}" for k in range(v("judge.seeds"))] + ["perplexity"]
    cells += ["short_perplexity"] if row == "extended" else []   # the goal's windows: this row and base only
    # the passkey: the checkpoint's only (6 trials cannot tell two rows apart, and they are half of a row's passes)
    return cells + (["passkey"] if v("judge.passkey_depths") and row == "extended" else [])


def cell_passes(plan, row: str, cell: str) -> tuple[int, int]:
    """The forward passes a judge cell runs at the target and at the original context: a recall cell its
    sequences with their controls; perplexity one pass at the target (the base's at the original context), and one
    at the original context for a row that reads the input's length (the searched longrope: its perplexity there
    is not the first tokens of the pass at the target); the goal's windows; the passkey's trials."""
    from hf_posenc.eval import recall

    v = plan.value
    T, L = v("target"), plan.facts.original
    if cell.startswith("recall_seed"):
        return 2 * recall.cell_sequences(T, v("judge.passages"), judge_passage(L))[1], 0
    if cell == "perplexity":
        return (0, 1) if row == "base" else (1, int(bool(v("search")) and row in ("extended", "start")))
    if cell == "short_perplexity":
        return 0, SHORT_WINDOWS
    return PASSKEY_TRIALS * len(v("judge.passkey_depths")), 0


QUICK = ("Judged quick (judge.mode quick): one passage seed, no passkey; the same command with `--judge.mode full` "
         "judges this checkpoint again with two seeds and the passkey.")
PASSKEY_TRIALS = 2   # passkey trials at each depth of the key
SHORT_WINDOWS = 6   # perplexity windows at the original context the goal's +1 % is read on (fewer in a short text)


def short_perplexity(model, ids: list[int], prefix: list[int], length: int, windows: int = SHORT_WINDOWS) -> dict:
    """Mean token NLL of up to `windows` windows of `length` tokens (each from the text's prefix), apart and spread
    evenly over the text: the extended model and the unpatched one read the same windows and pair by them."""
    import torch

    from hf_posenc.eval.perplexity import token_nll

    body = length - len(prefix)
    count = max(1, min(windows, len(ids) // body))
    offsets = [k * (len(ids) - body) // max(1, count - 1) for k in range(count)] if count > 1 else [0]
    nll = []
    for offset in offsets:
        with torch.inference_mode():
            nll.append(float(token_nll(model, torch.tensor([prefix + ids[offset:offset + body]])).mean()))
    return {"length": length, "offsets": offsets, "nll": nll}


def perplexity_ratio(cell: dict, other: dict) -> dict:
    """cell's perplexity over other's, - 1, paired window by window: mean and 95 % bootstrap interval (n windows)."""
    from hf_posenc.eval import stats

    d = stats.paired_difference(cell["nll"], other["nll"])
    return {"n": d["n"], **{k: math.expm1(d[k]) for k in ("mean", "low", "high")}}


def load_row(run, row: str, dtype):
    """The model a row measures: the checkpoint, its untrained start, or the base patched to the target."""
    import hf_posenc as hp
    from hf_posenc import eval as hpe

    folder = {"extended": run.trained, "start": run.out / "search" / "best"}.get(row)
    model = hp.load_model(str(folder) if folder else run.plan.facts.ref, dtype=dtype,
                          attn_implementation=run.plan.facts.passes)
    if row in ("yarn", "self_extend"):
        hp.patch(model, row, **hpe.variant_params(model, row, {}, run.plan.value("target")))
    return model.eval()


class Pace:
    """The judge's cells left and the minutes they should take: the plan's estimate of each, scaled by how this
    run's cells have gone against theirs (the machine may be faster, slower or busy)."""

    def __init__(self, cells: list[tuple[str, str]], estimate):
        self.cells, self.estimate, self.done = cells, estimate, 0
        self.planned = self.spent = 0.0   # seconds: the plan's for the cells measured, and what they took
        self.started = None

    def next(self, row: str, cell: str) -> str:
        """The line for the cell that starts now; the one before it is counted as done."""
        if self.started is not None:
            self.planned += self.estimate(*self.cells[self.done])
            self.spent += time.perf_counter() - self.started
            self.done += 1
        self.started = time.perf_counter()
        left = sum(self.estimate(*c) for c in self.cells[self.done:]) / 60
        paced = f"~{left * self.spent / self.planned:.0f} min left in the judge at this run's pace" if self.spent \
            else f"~{left:.0f} min left in the judge (estimate)"
        return f"cell {self.done + 1} of {len(self.cells)}: {row}, {cell} ({paced})"


def judge(run) -> None:
    """Every cell of every row, each saved as it completes."""
    import torch

    import hf_posenc as hp
    from hf_posenc import corpora, loading
    from hf_posenc.eval import retrieval
    from hf_posenc.eval.perplexity import perplexity_by_length

    v, facts = run.plan.value, run.plan.facts
    path = cells_path(run)
    path.parent.mkdir(exist_ok=True)
    cells = json.loads(path.read_text()) if path.is_file() else {}
    rows = ["base", *run.plan.rows()]
    if all(f"{row}/{cell}" in cells for row in rows for cell in wanted_cells(run.plan, row)):
        return
    T, L = v("target"), facts.original
    tokenizer = hp.load_tokenizer(facts.ref)
    text = "\n".join(corpora.load_corpus(v("judge.corpus"))["text"])
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    prefix = corpora.bos_prefix(tokenizer)   # the text's length was counted before any stage ran (check_texts)
    dtype = loading.resolve_dtype(run.args.model.dtype)[0]
    pace = Pace([(row, c) for row in rows for c in wanted_cells(run.plan, row) if f"{row}/{c}" not in cells],
                run.plan.cell_seconds)
    for row in rows:
        todo = [c for c in wanted_cells(run.plan, row) if f"{row}/{c}" not in cells]
        if not todo:
            continue
        model = load_row(run, row, dtype)
        for cell in todo:
            print(f"judge: {pace.next(row, cell)}", flush=True)
            if cell.startswith("recall_seed"):
                found = recall_cell(model, tokenizer, ids, prefix, run.plan.record(), L,
                                    int(cell.removeprefix("recall_seed")))
            elif cell == "perplexity":
                lengths = [L] if row == "base" else [L, T]
                with torch.inference_mode():
                    found = perplexity_by_length(model, [prefix + ids[:T]], lengths)
            elif cell == "short_perplexity":
                found = short_perplexity(model, ids, prefix, L)
            else:
                trials = retrieval.make_trials("passkey", tokenizer, lengths=[T], depths=v("judge.passkey_depths"),
                                               trials=PASSKEY_TRIALS, seed=0)
                scores = retrieval.score_trials(model, trials)
                found = {"found": sum(s["correct"] for s in scores), "trials": len(scores),
                         "logprobs": [s["logprob"] for s in scores]}
            cells[f"{row}/{cell}"] = found
            write_json(path, cells)
        del model


# ---------------------------------------------------------------------------------------------- the report
def pooled(cells: dict, row: str, seeds: int) -> list[dict]:
    """A row's recall passages over the seeds, in one order for every row (paired by seed, sequence, passage)."""
    out = []
    for k in range(seeds):
        cell = cells.get(f"{row}/recall_seed{k}")
        if cell is None:
            return []
        out += sorted(({**p, "seed": k} for p in cell["passages"]), key=lambda p: (p["sequence"], p["passage"]))
    return out


def interval(d: dict, digits: int = 2) -> str:
    if d["n"] == 0 or math.isnan(d["mean"]):
        return "-"
    if d["n"] < 2 or math.isnan(d["low"]):
        return f"{d['mean']:+.{digits}f} (n {d['n']})"
    return f"{d['mean']:+.{digits}f} [{d['low']:+.{digits}f}, {d['high']:+.{digits}f}] (n {d['n']})"


def distance_bins(target: int, width: int) -> list[tuple[int, int, str]]:
    """(from, to, label) of the report's distance bins: `width` tokens each, the last cut at the target."""
    edges = [*range(0, target, width), target]
    return [(a, b, f"{a // 1024}-{b // 1024}k" if width % 1024 == 0 else f"{a}-{b}") for a, b in zip(edges, edges[1:])]


def recall_tables(run, cells: dict) -> tuple[list[str], dict]:
    """The gap by distance bin of every row, and the extended row's paired differences from each other row (the
    same passages: the pairing removes how hard each passage is); the goals read from them."""
    from hf_posenc.eval import stats

    v = run.plan.value
    T, width, seeds = v("target"), v("judge.bin"), v("judge.seeds")
    rows = run.plan.rows()
    passages = {row: pooled(cells, row, seeds) for row in rows}
    bins = distance_bins(T, width)
    lines = ["| row | " + " | ".join(name for _, _, name in bins) + " |", "|---|" + "---|" * len(bins)]
    for row in rows:
        lines.append(f"| {row} | " + " | ".join(
            interval(stats.bootstrap_mean([p["gap"] for p in passages[row] if a <= p["distance"] < b]))
            for a, b, _ in bins) + " |")
    goals = {}
    lines += ["", "Paired, extended minus each row, the same passages (nats / token; 95 % bootstrap):", "",
              "| extended - | " + " | ".join(name for _, _, name in bins) + " | last quarter | whole window |",
              "|---|" + "---|" * (len(bins) + 2)]
    last = 3 * T // 4
    for row in rows[1:]:
        def diff(keep):
            pairs = [(e["gap"], o["gap"]) for e, o in zip(passages["extended"], passages[row]) if keep(e["distance"])]
            return stats.paired_difference([a for a, _ in pairs], [b for _, b in pairs])
        per_bin = [{**diff(lambda d, a=a, b=b: a <= d < b), "bin": name} for a, b, name in bins]
        quarter, whole = diff(lambda d: d >= last), diff(lambda d: True)
        goals[row] = {"bins": per_bin, "last_quarter": quarter, "whole": whole}
        lines.append(f"| {row} | " + " | ".join(interval(d) for d in per_bin) + f" | {interval(quarter)} | "
                     f"{interval(whole)} |")
    return lines, goals


def goal_lines(goals: dict, perplexity: dict) -> list[str]:
    """The pipeline's goals, each met or missed as measured (a bin with fewer than 2 passages says so)."""
    out = []
    se, yarn = goals.get("self_extend"), goals.get("yarn")
    if se:
        measured = [d for d in se["bins"] if d["n"] >= 2]
        below = [d for d in measured if d["low"] < -0.10]
        if not measured:
            out.append("- every bin vs Self-Extend: too few passages")
        elif below:   # which bins, so that a reader sees where without opening the table
            out.append("- every bin >= untrained Self-Extend - 0.10 (lower ends): missed at "
                       + ", ".join(f"{d['bin']} ({interval(d)})" for d in below))
        else:
            out.append(f"- every bin >= untrained Self-Extend - 0.10 (lower ends): met (least lower end "
                       f"{min(d['low'] for d in measured):+.2f})")
        q = se["last_quarter"]
        if q["n"] >= 2:
            out.append(f"- the last quarter above Self-Extend (lower end > 0): {'met' if q['low'] > 0 else 'missed'} "
                       f"({interval(q)})")
    if yarn and yarn["last_quarter"]["n"] >= 2:
        q = yarn["last_quarter"]
        out.append(f"- the last quarter >= YaRN + 0.30: {'met' if q['mean'] >= 0.30 else 'missed'} ({interval(q)})")
    rise = perplexity.get("rise")
    if rise is not None:
        out.append(f"- perplexity at the original length within +1 % of the unpatched model (the mean): "
                   f"{'met' if rise['mean'] <= 0.01 else 'missed'} ({percent(rise)})")
    return out


def perplexity_summary(run, cells: dict) -> tuple[list[str], dict]:
    L, T = run.plan.facts.original, run.plan.value("target")
    lines = [f"| row | perplexity at {L} | at {T} |", "|---|---|---|"]
    for row in ["base", *run.plan.rows()]:
        cell = cells.get(f"{row}/perplexity")
        if cell:
            at = dict(zip(cell["lengths"], cell["perplexity"]))
            lines.append(f"| {row if row != 'base' else 'unpatched'} | {at[L]:.3f} | "
                         f"{format(at[T], '.3f') if T in at else '-'} |")
    base, ext = cells.get("base/short_perplexity"), cells.get("extended/short_perplexity")
    if not (base and ext):
        return lines, {"rise": None}
    rise = perplexity_ratio(ext, base)   # the goal's figure: windows over the whole text, paired
    lines += ["", f"At {L} tokens on {rise['n']} windows spread over the text, extended / unpatched - 1, paired window "
                  f"by window (95 % bootstrap): {percent(rise)}"]
    return lines, {"rise": rise}


def percent(d: dict) -> str:
    """+0.9 % [+0.0 %, +1.6 %] (n 6), or +5.1 % (n 1) without an interval."""
    if d["n"] < 2 or math.isnan(d["low"]):
        return f"{d['mean']:+.1%} (n {d['n']})"
    return f"{d['mean']:+.1%} [{d['low']:+.1%}, {d['high']:+.1%}] (n {d['n']})"


def passkey_lines(run, cells: dict) -> list[str]:
    """The checkpoint's passkey (a judge of an earlier version asked every row: those cells are not shown)."""
    c = cells.get("extended/passkey")
    if c is None:
        return []
    depths = run.plan.value("judge.passkey_depths")
    back = ", ".join(f"{int((1 - d) * run.plan.value('target'))}" for d in depths)
    return [f"Passkey, the key about {back} tokens back ({PASSKEY_TRIALS} trials a depth; the checkpoint's only: so "
            f"few trials cannot tell two rows apart): found {c['found']}/{c['trials']} (answer log-prob "
            f"{sum(c['logprobs']) / len(c['logprobs']):.2f})", ""]


def figure(run, cells: dict, path: Path) -> bool:
    """Recall gap against distance, a line and its 95 % band per row; False where matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    from hf_posenc.eval import stats

    from .finetune_card import corpus_name

    v = run.plan.value
    T, width = v("target"), v("judge.bin")
    fig, ax = plt.subplots(figsize=(7, 4))
    for row in run.plan.rows():
        passages = pooled(cells, row, v("judge.seeds"))
        xs, ms, lo, hi = [], [], [], []
        for a in range(0, T, width):
            d = stats.bootstrap_mean([p["gap"] for p in passages if a <= p["distance"] < a + width])
            if d["n"] >= 2:
                xs.append((a + width / 2) / 1024), ms.append(d["mean"]), lo.append(d["low"]), hi.append(d["high"])
        ax.plot(xs, ms, marker="o", label=row)
        ax.fill_between(xs, lo, hi, alpha=0.2)
    ax.set_xlabel("distance back (k tokens)")
    ax.set_ylabel("recall gap (nats / token)")
    ax.set_title(f"recall at {T} on {corpus_name(v('judge.corpus'))}: extended vs its start and training-free methods")
    ax.axvline(run.plan.facts.original / 1024, color="grey", lw=0.8, ls="--")
    ax.legend(loc="center left", bbox_to_anchor=(1, 0.5))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def held_out(text: str, read: list[str]) -> bool:
    """Whether a judge's text is none of the texts the stages read, however each is spelled."""
    from hf_posenc.corpora import shares_text

    return not any(shares_text(text, r) for r in read)


def held_out_words(run) -> str:
    v = run.plan.value
    read = [v("train.corpus"), *([v("search.corpus")] if v("search") else [])]
    return ("a text neither the search nor the fine-tune read" if held_out(v("judge.corpus"), read) else
            "NOT held out: a stage of this run read it, so the figures say how it fits that text")


def report(run) -> str:
    """REPORT.md: the plan, the judged figures (or why there are none), and what each stage took."""
    from .finetune_card import corpus_name

    v = run.plan.value
    path = cells_path(run)
    cells = json.loads(path.read_text()) if path.is_file() else {}
    lines = [f"# {Path(run.out).name}: {run.plan.facts.model_type} from {run.plan.facts.original} to {v('target')} "
             f"tokens", "", "## Plan", "", "| setting | value | why |", "|---|---|---|",
             *(f"| {s.name} | {corpus_name(s.value) if s.name.endswith('.corpus') else format_value(s.value)} | "
               f"{'(given) ' if s.given else ''}{s.reason} |" for s in run.plan.settings), ""]
    judged = v("judge.mode") != "skip" and cells
    if judged:
        table, goals = recall_tables(run, cells)
        ppl, rise = perplexity_summary(run, cells)
        lines += ["## Judged", "", *([QUICK, ""] if v("judge.mode") == "quick" else []),
                  f"On `{corpus_name(v('judge.corpus'))}`, {held_out_words(run)}. Recall "
                  f"at a distance at {v('target')} tokens: passages of the text repeated later in one sequence, the "
                  f"gap = loss of a repeat without its first copy (control pass) - with it, nats / token; mean "
                  f"[95 % bootstrap] (n), {passages_words(run)} a seed at distances even over the window "
                  f"over {v('judge.seeds')} seed(s). "
                  f"`start` is the untrained search result, `yarn` and `self_extend` the base model patched to the "
                  f"target, no training.", "", *table, "", "Goals:", "", *goal_lines(goals, rise), "",
                  f"![recall by distance]({FIGURE})", "", "Perplexity on the same text (its first tokens):", "",
                  *ppl, "", *passkey_lines(run, cells)]
    else:
        lines += ["## Judged", "", "Not judged (judge.mode skip): run `hf-posenc extend` again with --judge.mode "
                  "quick or full on this folder's settings to add the report card.", ""]
    done, planned = run.done, run.plan.estimates()
    lines += ["## Time", "", f"Wall time on {run.plan.machine[1]}, every run of a stage added up (a killed run's to "
              f"the last time it wrote clock.json, at most half a minute before), beside the plan's estimate:", "",
              "| stage | minutes | planned |", "|---|---|---|",
              *(f"| {stage} | {info['seconds'] / 60:.1f} | {planned[stage]:.1f} |" for stage, info in done.items()),
              ""]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------- the export
def export(run) -> None:
    """The fine-tuned checkpoint's files at the root (each replaced whole), REPORT.md, the figure, README.md."""
    from hf_posenc.export.serving import whole_file

    source = run.trained
    for file in sorted(source.iterdir()):
        if file.is_file() and file.name not in RUN_RECORDS:
            with whole_file(run.out / file.name) as fresh:
                shutil.copyfile(file, fresh)
    path = cells_path(run)
    cells = json.loads(path.read_text()) if path.is_file() else {}
    drew = bool(cells) and figure(run, cells, run.out / FIGURE)
    if not drew:   # an earlier judgement's figure is not this report's
        (run.out / FIGURE).unlink(missing_ok=True)
    text = report(run)
    if not drew:
        text = text.replace(f"![recall by distance]({FIGURE})", "(no figure: the plot extra, matplotlib, is not "
                                                                "installed)")
    (run.out / "REPORT.md").write_text(text)
    (run.out / "README.md").write_text(card(run, cells))


def given_words(run) -> str:
    """The settings the run was given instead of the plan's rules, as the card names them (a local text by its own
    name: no path)."""
    from .finetune_card import corpus_name

    given = [f"{s.name} {corpus_name(s.value) if s.name.endswith('.corpus') else format_value(s.value)}"
             for s in run.plan.settings if s.given and s.name not in ("target", "output_dir")]
    return f", with {', '.join(given)} given (the plan's rules for the rest: REPORT.md)" if given else ""


def card(run, cells: dict) -> str:
    """README.md of the extended checkpoint: what it was made from, what it carries, how it was trained and judged."""
    import transformers

    from .finetune_card import corpus_name
    from .patch_card import base_name, carried_rope, front_matter

    v, facts = run.plan.value, run.plan.facts
    config = transformers.AutoConfig.from_pretrained(run.out)
    rope = config.get_text_config().rope_parameters
    factors = rope.get("long_factor")
    carried = (f"`longrope` with the searched factors (one per rotary pair, the same at every length: "
               f"`long_factor` = `short_factor` = {json.dumps(factors)}), attention factor "
               f"{rope.get('attention_factor')}" if factors else f"`{json.dumps(carried_rope(config))}`")
    judged = "Not judged (judge.mode skip)."
    if cells and v("judge.mode") != "skip":
        _, goals = recall_tables(run, cells)
        _, rise = perplexity_summary(run, cells)
        se = goals.get("self_extend")
        judged = (f"On `{corpus_name(v('judge.corpus'))}` ({held_out_words(run)}), recall at a distance at "
                  f"{v('target')} tokens, extended minus "
                  f"untrained Self-Extend, paired: whole window {interval(se['whole'])}, last quarter "
                  f"{interval(se['last_quarter'])} nats / token" if se else "")
        judged += "; " + "; ".join(g.removeprefix("- ") for g in goal_lines(goals, rise)) + ". Every bin: REPORT.md."
        if v("judge.mode") == "quick":
            judged += f" {QUICK}"
    return "\n".join([
        *front_matter(facts.ref), f"# {base_name(facts.ref)} extended to {v('target')} tokens", "",
        f"Extended with hf_posenc (`hf-posenc extend --model {shlex.quote(base_name(facts.ref))} --target "
        f"{v('target')}`) from "
        f"{facts.original} to {v('target')} tokens{given_words(run)}.", "",
        f"- **Positions**: {carried}. Stock transformers loads it as is "
        f"(`AutoModelForCausalLM.from_pretrained(folder)`); `hf-posenc export folder model.gguf` writes it for "
        f"llama.cpp.",
        "- **Search**: " + (f"LongRoPE2-style factor search, {v('search.candidates') + 5} candidates scored by recall "
                            f"at a distance on `{corpus_name(v('search.corpus'))}`, the pairs from the critical one "
                            f"({facts.critical} of {facts.pairs}) held at >= {v('search.critical_floor')} x s"
                            if v("search") else "none (one RoPE per layer type): the fine-tune started from YaRN"),
        f"- **Training**: {v('train.steps')} steps of one {v('train.seq_len')}-token window "
        f"({v('train.steps') * v('train.seq_len'):,} tokens) of `{corpus_name(v('train.corpus'))}`, documents "
        f"{'kept apart' if v('train.packing') == 'documents' else 'joined'}, PoSE ids spread over {v('target')} "
        f"(`{v('train.positions')}`), LongCE (window {v('train.longce_window')}), lr {v('train.lr')}"
        + (f"; then {v('train.short_steps')} step{'s' if v('train.short_steps') != 1 else ''} of one contiguous "
           f"{min(v('train.seq_len'), facts.original)}-token window inside the original context"
           + (f" (each drawn with odds {v('train.short_long_share'):g} as a long one, PoSE as above)"
              if v("train.short_long_share") else "")
           + f", cross-entropy, lr {v('train.short_lr')}" if v("train.short_steps") else ""),
        f"- **Judged**: {judged}", "",
        "REPORT.md holds the plan, every distance bin, perplexity, the passkey and the time each stage took.", ""])
