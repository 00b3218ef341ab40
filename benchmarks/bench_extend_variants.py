"""Variants of an `hf-posenc extend` checkpoint, judged on the run's own held-out passages: does a change keep the
perplexity inside the original context without paying far recall?

For each row: recall at the run's target on the judge's passages (the same seeds, layout and text as the run's
judge/cells-*.json, so every row pairs passage by passage with the run's `extended` row and its untrained
Self-Extend), and perplexity at the original length on the judge's windows of the held-out text (the windows the
card's `+1 %` goal is read on, each one forward pass from a fresh start), paired window by window with the unpatched
model and with the run's checkpoint.

Rows: NAME=FOLDER (a saved checkpoint), NAME=FOLDER:switched (that checkpoint with its short factors set to 1: the
unpatched frequencies for an input inside the original context, the searched ones past it, as transformers'
longrope switches them per forward; its attention factor stays, and its recall at the target is the folder's).
`unpatched`, `extended` (the run's checkpoint: its short stage's weights where it has one) and `start` (its
untrained search result) are always in the perplexity table; their recall is the judge's, and so are the perplexity
windows of `unpatched` and `extended` where the judge has measured them (one answer: the card's figure). A run with a
short stage adds `finetune` (the fine-tune alone), recall and perplexity measured here.

Every cell is saved as it completes (--out); a rerun goes on where the last one stopped. --report prints the tables.

    OMP_NUM_THREADS=2 nice python benchmarks/bench_extend_variants.py --run runs/extend_smollm2_24576 \\
        --rows share50=runs/variants24k/share50 --out benchmarks/results/extend_variants_24k_judge_windows.json
    python benchmarks/bench_extend_variants.py --run runs/extend_smollm2_24576 --report \\
        --out benchmarks/results/extend_variants_24k_judge_windows.json
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import torch

import common
import hf_posenc as hp
from hf_posenc import corpora
from hf_posenc.eval import stats
from hf_posenc.recipes import extend_report

JUDGED = ("unpatched", "extended", "start")   # always in the tables; their recall is the judge's


def run_rows(run: Path, model: str, settings: dict) -> dict:
    """The rows every report has: NAME -> (folder, switched). `extended` is the run's checkpoint, the weights of its
    last trained stage (what the judge judged as `extended` and the export copied: the pipeline's rule)."""
    trained = run / "short" if settings.get("train.short_steps") else run / "finetune"   # a plan before the stage: 0
    rows = {"unpatched": (model, False), "extended": (str(trained), False)}
    if settings["search"]:
        rows["start"] = (str(run / "search" / "best"), False)
    if trained.name == "short":
        rows["finetune"] = (str(run / "finetune"), False)
    return rows


def run_settings(run: Path) -> dict:
    plan = run / "plan.json"
    if not plan.is_file():
        common.refuse(f"--run {run}: no plan.json there (the output folder of `hf-posenc extend`)")
    return json.loads(plan.read_text())["settings"]


def check_model(run: Path, model: str) -> None:
    """--model is the run's base (plan.json keeps which, without its path): not another model called unpatched."""
    from hf_posenc import user_input
    from hf_posenc.recipes.extend import model_key

    plan = json.loads((run / "plan.json").read_text())
    if model_key(user_input.model_ref(model)) != plan.get("model_path"):
        common.refuse(f"--model {model} is not the model the run extended ({plan.get('model')}): give the --model "
                      f"the run was given")


def judge_text(settings: dict, given: str | None) -> str:
    """The judge's text: plan.json's, or --judge_corpus where the run's is local files (checked to be those files)."""
    recorded = settings["judge.corpus"]
    local = " (local " in recorded   # plan.json names local files by corpora.text_key: no path to read them from
    if given is None:
        if local:
            common.refuse(f"the run's judge text is local files ({recorded}): name them with --judge_corpus")
        return recorded
    want = recorded if local else corpora.text_key(recorded)
    if corpora.text_key(given) != want:
        common.refuse(f"--judge_corpus {given} reads {corpora.text_key(given)}, not the run's judge text {want}")
    return given


def original_context(model: str) -> int:
    """The unpatched model's context (its text config: one for every family, Gemma 3's layer types included)."""
    from hf_posenc import loading, user_input

    return int(loading.load_config(user_input.model_ref(model)).get_text_config().max_position_embeddings)


def judge_cells(run: Path, settings: dict) -> dict:
    """The run's judge cells for its planned judge settings."""
    path = extend_report.cells_file(run, settings)
    if not path.is_file():
        common.refuse(f"--run {run}: no judge cells at {path}: judge the run first (rerun its extend command)")
    return json.loads(path.read_text())


def load_row(folder: str, switched: bool, dtype):
    model = hp.from_pretrained(folder, dtype=dtype, attn_implementation="sdpa").eval()
    if switched:   # main checked that the folder carries longrope
        rotary = model.model.rotary_emb
        rope = model.config.rope_parameters
        dim = rotary.original_inv_freq.numel() * 2
        base = 1.0 / (rope["rope_theta"] ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
        rotary.original_inv_freq = base   # what transformers' longrope reads for an input inside the original context
    return model


JUDGE_PERPLEXITY = {"unpatched": "base/short_perplexity", "extended": "extended/short_perplexity"}


def judge_perplexity(judged: dict) -> dict:
    """The rows whose perplexity windows the judge has measured (the card's figure): NAME -> its cell."""
    return {name: judged[key] for name, key in JUDGE_PERPLEXITY.items() if key in judged}


def todo_cells(name: str, switched: bool, seeds: int, cells: dict, judged: dict) -> list[str]:
    """The cells this bench still measures of a row: its perplexity windows unless saved here or the judge's, and its
    recall unless the judge's (the judged rows) or the folder's (a switched row reads past L with its long set)."""
    todo = [] if name in judge_perplexity(judged) else ["short_perplexity"]
    todo += [f"recall_seed{k}" for k in range(seeds)] if not (name in JUDGED or switched) else []
    return [c for c in todo if f"{name}/{c}" not in cells]


def main() -> None:
    parser = common.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", required=True, help="the output folder of `hf-posenc extend`")
    parser.add_argument("--rows", nargs="*", default=[], help="NAME=FOLDER or NAME=FOLDER:switched")
    parser.add_argument("--out", required=True)
    parser.add_argument("--report", action="store_true")
    parser.add_argument("--model", default="smollm2", help="the unpatched model: the run's base (checked)")
    parser.add_argument("--judge_corpus", help="the run's judge text where it is local files (plan.json names them "
                                               "without their path; checked against it)")
    args = parser.parse_args()

    run = Path(args.run)
    settings = run_settings(run)
    check_model(run, args.model)
    text = judge_text(settings, args.judge_corpus)
    if Path(args.out).resolve().is_relative_to(run.resolve()):
        common.refuse(f"--out {args.out} is inside the run's folder (its records and checkpoint): give a results file "
                      f"outside it")
    rows = run_rows(run, args.model, settings)
    for spec in args.rows:
        name, _, folder = spec.partition("=")
        folder, _, mode = folder.partition(":")
        taken = [*rows, *settings["judge.rows"]]   # the judge's rows too: a row of that name would replace theirs
        if not name or not folder or mode not in ("", "switched") or name in taken:
            common.refuse(f"row {spec!r}: a row is NAME=FOLDER or NAME=FOLDER:switched, its NAME new (not "
                          f"{', '.join(taken)})")
        rows[name] = (folder, mode == "switched")
    for name, (folder, switched) in rows.items():   # every checkpoint there before the first slow cell
        config = Path(folder) / "config.json"
        if name != "unpatched" and not config.is_file():
            common.refuse(f"row {name}: no checkpoint at {folder} (no config.json)")
        if switched:   # transformers 5 writes rope_parameters, 4.x rope_scaling ("type" in older files)
            saved = json.loads(config.read_text())
            rope = saved.get("rope_parameters") or saved.get("rope_scaling") or {}
            kind = rope.get("rope_type", rope.get("type"))
            if kind != "longrope":
                common.refuse(f"row {name}: {folder} carries {kind!r}, not longrope: nothing to switch")
    judged = judge_cells(run, settings)
    results, save = common.results_file(args.out, {"run": str(run), "windows": "the judge's",
                                                   "extended": rows["extended"][0]}, ["cells"])
    cells = results["cells"]
    if args.report:
        return report(rows, settings, judged, cells)

    seeds = settings["judge.seeds"]
    tokenizer = hp.load_tokenizer(args.model)
    ids = common.corpus_ids(tokenizer, text)
    prefix = corpora.bos_prefix(tokenizer)
    L = original_context(args.model)
    dtype = torch.float32 if settings["dtype"] == "float32" else torch.bfloat16
    print(common.machine(), flush=True)
    for name, (folder, switched) in rows.items():
        todo = todo_cells(name, switched, seeds, cells, judged)
        if not todo:
            continue
        model = load_row(folder, switched, dtype)
        for cell in todo:
            print(f"{name}: {cell}", flush=True)
            if cell == "short_perplexity":
                windows = cells[f"{name}/{cell}"] = extend_report.short_perplexity(model, ids, prefix, L)
                print("  perplexity by window: " + ", ".join(f"{math.exp(x):.3f}" for x in windows["nll"]), flush=True)
            else:
                cells[f"{name}/{cell}"] = extend_report.recall_cell(model, tokenizer, ids, prefix, settings, L,
                                                                    int(cell.removeprefix("recall_seed")))
            save()
        del model
    report(rows, settings, judged, cells)


def report(rows: dict, settings: dict, judged: dict, cells: dict) -> None:
    T, seeds = settings["target"], settings["judge.seeds"]
    every = {**{k: v for k, v in judged.items() if "/recall_seed" in k}, **cells}
    ppl = {key.split("/")[0]: cell for key, cell in cells.items() if key.endswith("/short_perplexity")}
    ppl.update(judge_perplexity(judged))
    print("Perplexity at the original length on the judge's windows of the held-out text; each row's ratio - 1 to the "
          "unpatched model and to the run's checkpoint, paired window by window (95 % bootstrap):")
    for name, cell in sorted(ppl.items(), key=lambda item: list(rows).index(item[0]) if item[0] in rows else len(rows)):
        mean = math.exp(sum(cell["nll"]) / len(cell["nll"]))
        against = [f"{other} {extend_report.percent(extend_report.perplexity_ratio(cell, ppl[other]))}"
                   for other in ("unpatched", "extended")
                   if other in ppl and name not in (other, "unpatched")]
        print(f"  {name:<14} {mean:.3f}  " + "; ".join(against))
    last = 3 * T // 4
    print(f"Recall at {T}, pooled over {seeds} seeds; each row minus the run's extended and untrained Self-Extend:")
    for name in rows:
        if name == "unpatched" or not all(f"{name}/recall_seed{k}" in every for k in range(seeds)):
            continue
        mine = extend_report.pooled(every, name, seeds)
        for other in ("extended", "self_extend"):
            theirs = extend_report.pooled(every, other, seeds)
            if name == other or not theirs:
                continue
            def diff(keep):
                pairs = [(a["gap"], b["gap"]) for a, b in zip(mine, theirs) if keep(a["distance"])]
                return stats.paired_difference([a for a, _ in pairs], [b for _, b in pairs])

            for what, keep in (("whole window", lambda d: True), ("last quarter", lambda d: d >= last)):
                print(f"  {name} - {other}, {what}: {extend_report.interval(diff(keep))}")
            if other == "self_extend":   # the goal: every bin's lower end >= -0.10
                bins = [f"{name} {extend_report.interval(diff(lambda d, a=a, b=b: a <= d < b))}"
                        for a, b, name in extend_report.distance_bins(T, settings["judge.bin"])]
                print(f"  {name} - {other}, by bin: " + "; ".join(bins))


if __name__ == "__main__":
    common.run(main)
