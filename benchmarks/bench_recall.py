"""Recall at a distance (hf_posenc/eval/recall.py) and probes on one shared prefill, for the training-free methods
on SmolLM2-135M (8k) at 16k and 32k, and for fine-tuned folders: which differences are real, with intervals.

A cell is one (row, length): `passages` passages of 192 tokens of a held-out text (default: the King James
Bible, not a play: the fine-tunes trained on plays), first copies in the first half of each sequence and repeats
in the second, one pass with the first copies and one control pass per sequence (--one-pass: none). The same
passages at the same places for every row, so rows are compared passage by passage (paired differences).
Rows: `none` (unpatched: inside its own 8k the reference, at 16k the negative control past its context), `ntk`,
`yarn`, `dynamic_yarn`, `dca`, `self_extend` (each patched to the cell's length, at least 16k), `yarn_switched` (YaRN's
frequencies past 8k, the unpatched ones inside, attention factor 1: a mixed-windows fine-tune's start), or
NAME=FOLDER (a saved fine-tune, loaded with hp.from_pretrained).

`--probes N` adds one cell: N multikey probes (hf_posenc/eval/ruler.py) on one prefill of the longest length,
the prefill's CPU time against the probes', for the first row.

Every cell is saved as it completes (--out); a rerun goes on where the last one stopped. Long: run it in the
background with one thread (the CPU seconds are then one core's). --report reads --out (and --also, --pool) and
checks every cell and every row it is asked for before it prints: a cell cut short or without its gap, a row no file
holds, pooled files with no cell in common are refused, naming the file and the cell or the flag.

    OMP_NUM_THREADS=1 nice python benchmarks/bench_recall.py --rows none yarn dca self_extend --lengths 16384 32768
    python benchmarks/bench_recall.py --report --figure docs/recall_distance.png
    python benchmarks/bench_recall.py --report --pool benchmarks/results/recall_seed1.json   # + other passages
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

import torch

import common
import hf_posenc as hp
from hf_posenc import corpora
from hf_posenc import eval as hpe
from hf_posenc.eval import probes as probes_module
from hf_posenc.eval import recall, ruler, stats

ORIGINAL = 8192   # SmolLM2-135M's own context
PASSAGE = 192
PAIRS = [("self_extend", "yarn"), ("dca", "yarn"), ("self_extend", "dca"), ("ntk", "yarn"), ("dynamic_yarn", "yarn")]
FEWEST = 5   # passages a paired difference needs: a bootstrap of 2-4 differences gives an interval far too narrow
CONTROL = "contiguous"   # issue 22's control fine-tune (ids 0..n-1): every other fine-tuned row is judged against it


DEVICE = common.DEVICE


def load_row(row: str, length: int, dtype: torch.dtype, ref: str = "smollm2"):
    name, _, folder = row.partition("=")
    if folder:
        return hp.from_pretrained(folder, dtype=dtype, attn_implementation="sdpa").to(DEVICE).eval()
    model = hp.load_model(ref, dtype=dtype, attn_implementation="sdpa").to(DEVICE).eval()
    if name == "yarn_switched":   # the untrained start of a mixed-windows fine-tune (hf_posenc/train/mixed_windows.py)
        from hf_posenc.train import mixed_windows

        params = hpe.variant_params(model, "yarn", {}, max(length, 2 * ORIGINAL))
        hp.patch(model, "longrope", **mixed_windows.switched_params(model, "yarn", params))
    elif name != "none":
        params = hpe.variant_params(model, name, {}, max(length, 2 * ORIGINAL))
        hp.patch(model, name, **params)
    return model


def check_rows(rows: list[str]) -> None:
    """Refuse, before anything loads, a row that names no method and no saved model (a fine-tune still
    training has no config.json yet: its folder is refused, not found out 20 minutes into a cell)."""
    from hf_posenc.errors import ModelNotFoundError, UnknownMethodError
    from hf_posenc.loading import resolve
    from hf_posenc.registry import get_method

    names = [row.partition("=")[0] for row in rows]
    for row, name in zip(rows, names):
        folder = row.partition("=")[2]
        if not name:
            common.refuse(f"row {row!r}: a row is a method (none, yarn, dca, ...) or NAME=FOLDER")
        try:
            if folder:
                resolve(folder)
            elif name not in ("none", "yarn_switched"):
                get_method(name)
        except (ModelNotFoundError, UnknownMethodError) as err:
            common.refuse(f"row {row!r}: {err}")
    if len(set(names)) < len(names):
        common.refuse(f"two rows share a name ({' '.join(rows)}): a cell is kept by its row's name")


def recall_sets(tokenizer, ids: list[int], length: int, passages: int, seed: int) -> list:
    """The recall sequences of a cell at `length`: the same for every row (refused, before any model loads, when
    the text cannot hold them)."""
    per_sequence, sequences = recall.cell_sequences(length, passages, PASSAGE)   # 24 a sequence at 16k, 48 at 32k
    prefix = corpora.bos_prefix(tokenizer)
    layout = recall.plan_layout(length, passages=per_sequence, passage_tokens=PASSAGE, head=len(prefix), seed=seed)
    return recall.make_recall(tokenizer, ids, layout, sequences=sequences, seed=seed, prefix=prefix)


def recall_cell(model, sets: list, length: int, control: bool, seed: int) -> dict:
    sequences = len(sets)
    start, cpu = time.perf_counter(), time.process_time()
    rows = recall.score_recall(model, sets, control=control)
    summary = recall.summarize_recall(rows, length=length, bin_width=4096)
    return {**summary, "sequences": sequences, "wall_s": time.perf_counter() - start,
            "cpu_s": time.process_time() - cpu}


def probes_cell(model, tokenizer, ids: list[int], length: int, count: int, seed: int) -> dict:
    """`count` multikey probes on one prefill: CPU time of the prefill alone, then of prefill + probes."""
    text = tokenizer.decode(ids[:3 * length])
    sample = ruler.make_samples("multikey", tokenizer, lengths=[length], samples=1, needles=count, haystack=text,
                                seed=seed)[0]
    probes = [(p.prompt, p.answer) for p in sample.probes]
    prefix = probes_module.common_prefix([p for p, _ in probes])
    cpu = time.process_time()
    with torch.inference_mode():
        model(torch.tensor([probes[0][0][:prefix]], device=DEVICE), use_cache=False, logits_to_keep=1)
    prefill = time.process_time() - cpu
    cpu = time.process_time()
    out = probes_module.score_probes(model, probes)
    total = time.process_time() - cpu
    return {"probes": count, "prefix": prefix, "shared": out["shared"], "prefill_cpu_s": prefill,
            "with_probes_cpu_s": total, "ratio": total / prefill,
            "found": sum(s["correct"] for s in out["scores"])}


def main() -> None:
    parser = common.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", nargs="+", default=["none", "ntk", "yarn", "dynamic_yarn", "dca", "self_extend"])
    parser.add_argument("--lengths", type=common.count(2), nargs="+", default=[16384, 32768])
    parser.add_argument("--passages", type=common.count(1), default=48,
                        help="passages a cell (over as many sequences as needed)")
    parser.add_argument("--one-pass", action="store_true", help="the first copy's own loss as the baseline")
    parser.add_argument("--corpus", default="kjv", help="the held-out text (a load_corpus spec)")
    parser.add_argument("--text-ids", help="the held-out text as token ids already (a .npy file, e.g. of --corpus "
                                           "tokenized on a machine that has it): on a machine without the corpus")
    parser.add_argument("--model", default="smollm2", help="the model: smollm2 (embedded) or its .gguf file")
    parser.add_argument("--probes", type=common.count(0), default=0,
                        help=f"N multikey probes on one prefill (first row): 0 (none) or 2..{len(ruler.KEYS)}")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dtype", default=None, choices=common.DTYPES,
                        help="default: bfloat16 where the hardware runs it natively")
    parser.add_argument("--out", default="benchmarks/results/recall.json")
    parser.add_argument("--report", action="store_true", help="print the tables of --out (and draw --figure)")
    parser.add_argument("--figure", help="with --report: the gap against distance, a line per row (PNG)")
    parser.add_argument("--figure-rows", nargs="+", metavar="ROW", help="the rows the figure draws (default: all)")
    parser.add_argument("--also", metavar="JSON", help="with --report: the cells of another results file of the same "
                        "settings (another machine: the same passages), for the cells --out lacks; marked [also]")
    parser.add_argument("--pool", nargs="+", metavar="JSON", help="with --report: results files of other seeds (other "
                        "passages, the same settings otherwise): the cells all share, their passages pooled")
    parser.add_argument("--pairs", nargs="+", metavar="A:B", help="the paired differences to print (default: the "
                        f"training-free pairs, and each fine-tuned row against yarn, self_extend and {CONTROL})")
    args = parser.parse_args()
    for flag in ("pool", "also", "figure", "figure_rows"):
        if getattr(args, flag) and not args.report:
            common.refuse(f"--{flag.replace('_', '-')} goes with --report (it reads the cells of results files)")
    if args.figure_rows and not args.figure:
        common.refuse("--figure-rows goes with --figure (the rows the figure draws)")
    for flag, path in (("--out", args.out if args.report else None), ("--also", args.also)):
        if path and not Path(path).exists():
            common.refuse(f"{flag} {path}: no such results file (--report reads the cells a run saved there)")
    pairs = [tuple(p.split(":")) for p in args.pairs or []]
    if any(len(p) != 2 or not all(p) for p in pairs):
        common.refuse(f"--pairs takes A:B (two row names), got {' '.join(args.pairs)}")
    if not args.report:
        check_rows(args.rows)
    if args.probes == 1 or args.probes > len(ruler.KEYS):   # one key is no multikey sample; the keys are listed
        common.refuse(f"--probes must be 0 (none) or in 2..{len(ruler.KEYS)} (multikey's keys), got {args.probes}")
    if args.text_ids and not Path(args.text_ids).is_file():
        common.refuse(f"--text-ids {args.text_ids}: no such file")
    for length in args.lengths:
        recall.plan_layout(length, passages=recall.cell_sequences(length, args.passages, PASSAGE)[0],
                           passage_tokens=PASSAGE)   # refused here, before any loading, when it cannot fit
    args.dtype = common.dtype_name(args.dtype)
    results, save = common.results_file(args.out, {"passages": args.passages, "passage_tokens": PASSAGE,
                                                   "control": not args.one_pass, "corpus": args.corpus,
                                                   "seed": args.seed, "dtype": args.dtype},
                                        ["recall", "probes"])
    if args.report:   # every file and cell read, and every name given checked, before anything is printed
        check_cells(results["recall"], args.out, results["settings"])
        if args.also:
            also, _ = common.results_file(args.also, results["settings"], ["recall", "probes"])
            check_cells(also["recall"], args.also, results["settings"])
            for key, cell in also["recall"].items():
                results["recall"].setdefault(key, {**cell, "also": also.get("machine", args.also)})
        read = f"{args.out}{f' and --also {args.also}' if args.also else ''}"
        check_names(results["recall"], pairs, "--pairs", read)
        check_names(results["recall"], [(row,) for row in args.figure_rows or []], "--figure-rows", read)
        pool = pool_sets(results, args.pool) if args.pool else None
        if pool:
            for path, cells in zip(args.pool, pool[0][1:]):
                check_cells(cells, path, results["settings"])
            check_names(shared(pool[0]), pairs, "--pairs", "the cells --out and every --pool file share")
        report(results, args.figure, pairs, args.figure_rows)
        return pooled(*pool, pairs) if pool else None
    gpu = f"{torch.cuda.get_device_name()}, " if DEVICE == "cuda" else ""
    here = f"{gpu}{common.machine()}, SmolLM2-135M {args.dtype} sdpa, {torch.get_num_threads()} thread(s)"
    results.setdefault("machine", here)
    print(here, flush=True)
    dtype = getattr(torch, args.dtype)
    ids = None
    if args.text_ids:   # read (and refused) before anything loads
        import numpy

        try:
            array = numpy.load(args.text_ids, allow_pickle=False)
        except (ValueError, OSError, EOFError):
            common.refuse(f"--text-ids {args.text_ids} is not a .npy array of token ids (numpy.save of one row of "
                          f"ints): numpy cannot read it as one")
        if not isinstance(array, numpy.ndarray) or array.ndim != 1 or array.dtype.kind not in "iu":
            common.refuse(f"--text-ids {args.text_ids} holds {getattr(array, 'dtype', type(array).__name__)} of "
                          f"shape {getattr(array, 'shape', '?')}, not one row of integer token ids")
        ids = array.tolist()
    tokenizer = hp.load_tokenizer(args.model)
    if ids is None:
        ids = common.corpus_ids(tokenizer, args.corpus)
    todo = [length for length in args.lengths
            if any(f"{row.partition('=')[0]} {length}" not in results["recall"] for row in args.rows)]
    sets = {length: recall_sets(tokenizer, ids, length, args.passages, args.seed) for length in todo}
    for length in todo:
        for row in args.rows:
            key = f"{row.partition('=')[0]} {length}"
            if key in results["recall"]:
                continue
            model = load_row(row, length, dtype, args.model)
            with torch.autocast(DEVICE, dtype=dtype, enabled=dtype != torch.float32):
                cell = recall_cell(model, sets[length], length, not args.one_pass, args.seed)
            results["recall"][key] = {**cell, **({"folder": row.partition("=")[2]} if "=" in row else {})}
            save()
            print(f"{key}: gap {stats.interval_text(cell['gap'])}, recall distance {cell['recall_distance']}, "
                  f"{cell['cpu_s']:.0f} CPU-s", flush=True)
    if args.probes and f"{args.rows[0]} {max(args.lengths)}" not in results["probes"]:
        length = max(args.lengths)
        model = load_row(args.rows[0], length, dtype, args.model)
        with torch.autocast(DEVICE, dtype=dtype, enabled=dtype != torch.float32):
            results["probes"][f"{args.rows[0]} {length}"] = probes_cell(model, tokenizer, ids, length, args.probes,
                                                                        args.seed)
        save()
        print(results["probes"], flush=True)
    report(results, None, pairs)


def default_pairs(cells: dict) -> list[tuple[str, str]]:
    """The training-free pairs, then each fine-tuned row (a cell with a folder) against the untrained YaRN it
    started from, the training-free Self-Extend, and the contiguous control."""
    tuned = list(dict.fromkeys(k.split()[0] for k, c in cells.items() if "folder" in c))
    return PAIRS + [(row, other) for row in tuned for other in ("yarn", "self_extend", CONTROL) if other != row]


def paired(cells: dict, pairs: list[tuple[str, str]] | None) -> None:
    """Print each pair's paired difference over all distances, past 16k and 24k (and by 4k bin where the first row
    is fine-tuned), on the passages both cells hold, in the same order."""
    for length in sorted({int(k.split()[1]) for k in cells}):
        for a, b in pairs or default_pairs(cells):
            ca, cb = cells.get(f"{a} {length}"), cells.get(f"{b} {length}")
            if not (ca and cb):
                continue
            ranges = [(0, length, "all"), (16384, length, ">=16k"), (24576, length, ">=24k")]
            if "folder" in ca:   # a fine-tuned row, bin by bin against each row it is judged by
                ranges += [(x["start"], x["end"], f"{x['start'] // 1024}-{x['end'] // 1024}k")
                           for x in ca.get("bins", [])]
            for low, high, label in ranges:
                ga = [p["gap"] for p in ca["passages"] if low <= p["distance"] < high]
                gb = [p["gap"] for p in cb["passages"] if low <= p["distance"] < high]
                if not ga or len(ga) != len(gb):
                    continue
                if len(ga) < FEWEST:
                    print(f"- {length}: {a} - {b} ({label}, n {len(ga)}): too few passages for an interval")
                else:
                    d = stats.paired_difference(ga, gb)
                    print(f"- {length}: {a} - {b} ({label}, n {d['n']}): {d['mean']:+.3f} "
                          f"[{d['low']:+.3f}, {d['high']:+.3f}] {'differs' if d['differs'] else 'same'}")


def check_cells(cells: dict, path: str, settings: dict) -> None:
    """Refuse (naming the file and the cell) a cell that is not whole as report() reads it: a key "ROW LENGTH", its
    gap's interval, bins, recall distance and CPU time, and every passage the settings give a cell, each with its
    distance and gap (a cell cut short would be paired with other passages, or left out of the pairs unsaid)."""
    def numbers(value, keys) -> bool:
        return isinstance(value, dict) and all(isinstance(value.get(k), (int, float)) and not isinstance(
            value.get(k), bool) for k in keys)

    for key, cell in cells.items():
        where = f"{path}: the cell {key!r}"
        row_length = key.split()
        if len(row_length) != 2 or not row_length[1].isdigit() or not isinstance(cell, dict):
            common.refuse(f"{where} is not a recall cell (a key 'ROW LENGTH' and an object): not a results file of "
                          f"bench_recall.py")
        if not numbers(cell.get("gap"), ("n", "mean", "half_width")):
            common.refuse(f"{where} has gap {cell.get('gap')!r:.40}, not an interval (n, mean, half_width): a cell "
                          f"bench_recall.py did not write; delete it, and a rerun measures it again")
        lacks = [k for k in ("bins", "recall_distance", "beyond_measured", "cpu_s") if k not in cell]
        if lacks or not isinstance(cell["bins"], list) or not all(numbers(b, ("start", "end", "mean"))
                                                                  for b in cell["bins"]):
            common.refuse(f"{where} lacks {', '.join(lacks) or 'whole bins (start, end, mean)'}: a cell bench_recall.py "
                          f"did not write; delete it, and a rerun measures it again")
        passages = cell.get("passages")
        want = math.prod(recall.cell_sequences(int(row_length[1]), settings["passages"], settings["passage_tokens"]))
        if not isinstance(passages, list) or not all(numbers(p, ("distance", "gap")) for p in passages):
            common.refuse(f"{where} has no passages (a list of distance and gap each): its paired differences cannot "
                          f"be taken; delete it, and a rerun measures it again")
        if len(passages) != want:
            common.refuse(f"{where} holds {len(passages)} passages; a cell of {settings['passages']} passages at "
                          f"{row_length[1]} holds {want}: cut short; delete it, and a rerun measures it again")


def check_names(cells, names: list[tuple[str, ...]], flag: str, read: str) -> None:
    """Each row `flag` names (a pair of --pairs: at one length at least) is in the cells (their keys) of `read`:
    a name that matches none would be left out of the report without a word."""
    lengths: dict[str, set[int]] = {}
    for key in cells:
        row, length = key.split()
        lengths.setdefault(row, set()).add(int(length))
    for name in names:
        for row in name:
            if row not in lengths:
                common.refuse(f"{flag} {':'.join(name)}: no row {row!r} in {read} (its rows: "
                              f"{', '.join(sorted(lengths)) or 'none'})")
        if len(name) == 2 and not lengths[name[0]] & lengths[name[1]]:
            common.refuse(f"{flag} {':'.join(name)}: the two rows share no length in {read} ("
                          + "; ".join(f"{row} at {', '.join(map(str, sorted(lengths[row])))}" for row in name) + ")")


def shared(sets: list[dict]) -> list[str]:
    """The cells (keys) every set of cells holds, in the first set's order."""
    return [k for k in sets[0] if all(k in s for s in sets[1:])]


def pool_sets(results: dict, paths: list[str]) -> tuple[list[dict], list[int]]:
    """([the recall cells of --out, then of each file of `paths`], their seeds): files of other seeds (other
    passages) with the same settings otherwise, with at least one cell in common; anything else is refused."""
    sets, seeds = [results["recall"]], [results["settings"]["seed"]]
    for path in paths:
        if not Path(path).is_file():
            common.refuse(f"--pool {path}: no such results file")
        other = common.read_results(Path(path), ["recall", "probes"])
        theirs = other["settings"]
        common.check_settings(Path(path), {**results["settings"], **({"seed": theirs["seed"]} if "seed" in theirs
                                                                    else {})}, theirs, "holds results taken with",
                              "--pool takes results files of other seeds, the same settings otherwise")
        if other["settings"]["seed"] in seeds:
            common.refuse(f"--pool {path}: seed {other['settings']['seed']} again: the same passages, counted twice")
        sets.append(other["recall"])
        seeds.append(other["settings"]["seed"])
    if not shared(sets):
        common.refuse(f"--pool {' '.join(paths)}: no cell (row and length) is in --out and every --pool file, so "
                      f"there is nothing to pool")
    return sets, seeds


def pooled(sets: list[dict], seeds: list[int], pairs: list[tuple[str, str]] | None) -> None:
    """Each cell that every set holds, its passages pooled: the gap over all distances and past 16k, and the
    paired differences."""
    keys = shared(sets)
    cells = {k: {"passages": [p for s in sets for p in s[k]["passages"]],
                 "bins": [{"start": b["start"], "end": b["end"]} for b in sets[0][k].get("bins", [])],   # by 4k bin
                 **({"folder": sets[0][k]["folder"]} if "folder" in sets[0][k] else {})} for k in keys}
    print(f"\nPooled over the passages of seeds {', '.join(map(str, seeds))}:")
    print("| row | length | gap, all (95 %) | gap, >= 16k (95 %) |\n|---|---|---|---|")
    for key, c in cells.items():
        far = [p["gap"] for p in c["passages"] if p["distance"] >= 16384]
        print(f"| {key.split()[0]} | {key.split()[1]} | "
              f"{stats.interval_text(stats.bootstrap_mean([p['gap'] for p in c['passages']]))} | "
              f"{stats.interval_text(stats.bootstrap_mean(far)) if len(far) >= FEWEST else '-'} |")
    print("Paired, pooled:")
    paired(cells, pairs)


def report(results: dict, figure: str | None, pairs: list[tuple[str, str]] | None = None,
           figure_rows: list[str] | None = None) -> None:
    cells = results["recall"]
    print(results.get("machine", ""))
    print("\n| row | length | gap (95 %) | recall distance | by distance (4k bins) | CPU-s |\n|---|---|---|---|---|---|")
    for key, c in cells.items():
        bins = ", ".join(f"{b['start'] // 1024}-{b['end'] // 1024}k {b['mean']:.2f}" for b in c["bins"])
        far = f"{c['recall_distance']}" + ("+" if c["beyond_measured"] else "")
        print(f"| {key.split()[0]}{' [also]' if 'also' in c else ''} | {key.split()[1]} | {stats.interval_text(c['gap'])} | {far} | {bins} | "
              f"{c['cpu_s']:.0f} |")
    for machine in dict.fromkeys(c["also"] for c in cells.values() if "also" in c):
        print(f"[also]: measured on {machine}")
    print("\nPaired differences on the same passages (a - b, nats, 95 %; 'same' when the interval holds 0):")
    paired(cells, pairs)
    for key, p in results.get("probes", {}).items():
        print(f"\nprobes, {key}: {p['probes']} probes on one prefill of {p['prefix']} tokens: prefill "
              f"{p['prefill_cpu_s']:.0f} CPU-s, with the probes {p['with_probes_cpu_s']:.0f} CPU-s "
              f"({p['ratio']:.2f}x), found {p['found']}/{p['probes']}")
    if figure:   # one figure a length (FIGURE_16k.png, ...): twelve lines in one are unreadable
        from hf_posenc.eval import plots

        for length in sorted({int(k.split()[1]) for k in cells}):
            variants = {k.split()[0] + (" [also]" if "also" in c else ""): c for k, c in cells.items()
                        if int(k.split()[1]) == length and (not figure_rows or k.split()[0] in figure_rows)}
            if not variants:
                continue
            path = Path(figure).with_name(f"{Path(figure).stem}_{length // 1024}k.png")
            plots.plot_recall(variants, path, original_context=ORIGINAL,
                              title=f"Recall at a distance in {length // 1024}k tokens, SmolLM2-135M (8k native)")
            print(f"figure: {path}")


if __name__ == "__main__":
    common.run(main)
