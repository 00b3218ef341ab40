"""Train long on short: SmolLM2-135M (8k) taken to 32k with YaRN x4, fine-tuned on 2048-token windows with
each position scheme (hf_posenc/train/positions.py), against the training-free methods, on two held-out plays.

Rows (--rows): `none` (unpatched), `yarn` (x4, no training), `yarn_switched` (YaRN x4's frequencies past 8k and the
unpatched ones inside it, a switched longrope with attention factor 1: the start of a `train.mixed_windows`
fine-tune), `dca` (no training), and fine-tunes written
NAME=POSITIONS: `contiguous=contiguous` (the control: the same text, steps and tokens, ids 0..n-1),
`pose=pose chunks=2`, `cream=cream`, `pose_share=pose chunks=2 contiguous_share=0.5`, `span=pose chunks=2
text=span` (the tokens at the ids of a 32k span), `pose3=pose chunks=3`. Every fine-tune runs recipes/configs/smollm2_pose_32k_cpu_finetune.yaml
(40 plays: Hamlet and Richard III held out) with only train.positions changed (and --train-args for all).
A row NAME=@CONFIG [OVERRIDES] runs another config instead, with its own overrides (issue 30's rows):
`full=@recipes/configs/smollm2_full_32k_cpu_finetune.yaml`, `s2=@recipes/configs/smollm2_s2_32k_cpu_finetune.yaml`,
`longce_span=@recipes/configs/smollm2_pose_32k_cpu_finetune.yaml --train.loss longce --train.longce_window 512`.

For each row and held-out text (--plays; `kjv`, the King James Bible, is a held-out text that is not a play): one pass over the first 32768 tokens gives the perplexity of the first
2048 / 8192 / 32768 tokens and the late-token loss (mean NLL of tokens 24576-32767) given the whole prefix;
a second pass over tokens 16384-32767 gives the same tokens' loss given only the 16k window they sit in.
A model that uses its context past 16k has the first below the second. Then the passkey at 32768 (5 depths,
one trial each, seed 0: the trials of bench_long_context.py), with each trial's answer log-prob: their mean
with its interval, and each fine-tune's paired difference from the control. Each fine-tune's wall time, tokens/s and peak
memory come from its log.

Every cell is saved as it completes (--out); a rerun goes on where the last one stopped (a fine-tune
resumes from its last checkpoint). Long: run it in the background.

    nice python benchmarks/bench_short_to_long.py                       # everything
    python benchmarks/bench_short_to_long.py --only train               # the fine-tunes only
    python benchmarks/bench_short_to_long.py --report --figure docs/short_to_long.png   # tables + figure
"""

from __future__ import annotations

import argparse
import json
import math
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import torch

import common
import hf_posenc as hp
from hf_posenc.train import checkpoints as ckpt
from hf_posenc import eval as hpe
from hf_posenc.train import positions
from hf_posenc.eval import stats

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "recipes" / "configs" / "smollm2_pose_32k_cpu_finetune.yaml"
ROWS = ["none", "yarn", "dca", "contiguous=contiguous", "pose=pose chunks=2", "cream=cream",
        "pose_share=pose chunks=2 contiguous_share=0.5", "span=pose chunks=2 text=span", "pose3=pose chunks=3"]
TARGET, LENGTHS, LATE, WINDOW = 32768, [2048, 8192, 32768], 24576, 16384
ORIGINAL = 8192   # SmolLM2-135M's own context


def row_name(row: str) -> str:
    return row.partition("=")[0]


def recipe_args(row: str) -> list[str]:
    """The fine-tune recipe's arguments for a row: NAME=POSITIONS (the shipped CPU config, its positions
    changed) or NAME=@CONFIG [OVERRIDES] (another config, its overrides)."""
    spec = row.partition("=")[2]
    if spec.startswith("@"):
        config, *overrides = shlex.split(spec[1:])
        return ["--config", config, *overrides]
    return ["--config", str(CONFIG), "--train.positions", spec]


def finetune_argv(row: str, args) -> list[str] | None:
    """The fine-tune recipe's arguments for `row` (None when its fine-tune is done: the folder is complete)."""
    out = Path(args.runs) / row_name(row)
    if (out / "config.json").exists() and (out / "README.md").exists():
        return None
    return [*recipe_args(row), "--output_dir", str(out), *args.train_args, *(["--resume"] if out.exists() else [])]


def check_finetunes(rows: list[str], args) -> None:
    """Each fine-tune still to run, its config and --train-args checked as the recipe checks them (the fields,
    the paths, the corpus, the model's skeleton), before any work: a refusal is one line naming the row, not a
    child's traceback-ended run."""
    from hf_posenc.recipes.finetune_checks import check_config
    from hf_posenc.recipes.finetune_config import parse_config

    for row in rows:
        argv = finetune_argv(row, args)
        if argv is not None:
            try:
                check_config(parse_config(argv, prog="recipes/finetune.py"))
            except (hp.PosEncError, OSError) as err:
                common.refuse(f"row {row!r} (--train-args {shlex.join(args.train_args)}): {' '.join(str(err).split())}")


def finetune(row: str, args) -> dict:
    """Run (or resume) the fine-tune of `row`; its wall time, tokens/s and peak memory from its log. A run the
    recipe refuses ends this one with exit code 2 after the recipe's own `error:` line (no traceback)."""
    name, _, positions = row.partition("=")
    out = Path(args.runs) / name
    argv = finetune_argv(row, args)
    if argv is not None:
        command = [sys.executable, str(ROOT / "recipes" / "finetune.py"), *argv]
        print("$", " ".join(command), flush=True)
        code = subprocess.run(command).returncode
        if code == 2:   # the recipe's refusal, already on stderr as its one `error:` line
            raise SystemExit(2)
        if code:
            common.refuse(f"the fine-tune of row {row!r} ended with exit code {code} (its output is above); "
                          f"rerun to resume it from its last checkpoint")
    log = ckpt.read_log(out)
    steps = [r for r in log if "tokens_per_s" in r]
    tokens, seconds = sum(r["tokens"] for r in steps), sum(r["tokens"] / r["tokens_per_s"] for r in steps)
    return {"folder": str(out), "positions": positions, "steps": len(steps), "tokens": tokens,
            "seconds": seconds, "tokens_per_s": tokens / seconds, "peak_mem_mb": max(r["peak_mem_mb"] for r in steps)}


def load_row(row: str, args, dtype: torch.dtype):
    """The model of a row, on the GPU when there is one: the unpatched SmolLM2, patched with yarn / dca, or a
    fine-tuned folder."""
    name = row_name(row)
    if "=" in row:
        return hp.from_pretrained(str(Path(args.runs) / name), dtype=dtype, attn_implementation="sdpa").to(
            common.DEVICE).eval()
    model = hp.load_model("smollm2", dtype=dtype, attn_implementation="sdpa").to(common.DEVICE).eval()
    if name == "yarn_switched":   # the untrained start of a mixed-windows fine-tune (hf_posenc/train/mixed_windows.py)
        from hf_posenc.train import mixed_windows

        hp.patch(model, "longrope", **mixed_windows.switched_params(model, "yarn", {"max_position_embeddings": TARGET}))
    elif name != "none":
        hp.patch(model, name, max_position_embeddings=TARGET)
    return model


def held_out(tokenizer, names: list[str]) -> dict[str, list[int]]:
    """{name: its first TARGET tokens} for held-out plays and `kjv` (the books joined in order: Genesis on)."""
    docs = common.plays(tokenizer, [n for n in names if n != "kjv"], TARGET)
    if "kjv" in names:
        docs["kjv"] = common.corpus_ids(tokenizer, "kjv")[:TARGET]
    return {n: docs[n] for n in names}


@torch.no_grad()
def perplexity_cell(model, ids: list[int]) -> dict:
    full = hpe.token_nll(model, torch.tensor([ids[:TARGET]]))[0].double()   # entry t scores token t + 1
    window = hpe.token_nll(model, torch.tensor([ids[TARGET - WINDOW:TARGET]]))[0].double()
    late = slice(LATE - 1, TARGET - 1)
    # each shorter length its own pass: a rope that switches with the input's length (longrope, a mixed-windows
    # fine-tune) reads the first n tokens alone otherwise than inside the 32k pass
    alone = {n: hpe.token_nll(model, torch.tensor([ids[:n]]))[0].double() for n in LENGTHS if n < TARGET}
    return {"perplexity": {str(n): math.exp(alone.get(n, full)[:n - 1].mean().item()) for n in LENGTHS},
            "late_loss_full": full[late].mean().item(),
            "late_loss_16k": window[LATE - 1 - (TARGET - WINDOW):].mean().item()}


def main() -> None:
    parser = common.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", nargs="+", default=ROWS)
    parser.add_argument("--plays", nargs="+", default=["hamlet", "richard_iii"],
                        help="held-out plays, and kjv for a held-out text that is not a play")
    parser.add_argument("--depths", type=float, nargs="+", default=[0.1, 0.3, 0.5, 0.7, 0.9])
    parser.add_argument("--train-args", nargs=argparse.REMAINDER, default=[],
                        help="recipe overrides for every fine-tune, last on the line (--train-args --train.lr 5e-5)")
    parser.add_argument("--only", choices=["train", "perplexity", "passkey"], help="one part only")
    parser.add_argument("--dtype", default=None, choices=common.DTYPES,
                        help="default: bfloat16 where the hardware runs it natively")
    parser.add_argument("--runs", help="where the fine-tunes are written (default: runs/ and the name of --out, so "
                                       "that a file with other --train-args never reuses another file's fine-tunes)")
    parser.add_argument("--out", default="benchmarks/results/short_to_long.json")
    parser.add_argument("--report", action="store_true", help="print the table of --out (and draw --figure)")
    parser.add_argument("--figure", help="with --report: perplexity against length, every row (PNG)")
    parser.add_argument("--schemes-figure", metavar="PNG",
                        help="draw the ids each scheme gives one 2048-token window (target 32768) and stop")
    args = parser.parse_args()
    args.runs = args.runs or str(Path("runs") / Path(args.out).stem)
    if args.schemes_figure:
        return schemes_figure(args.schemes_figure)
    for row in args.rows:
        if "=@" in row:
            if not shlex.split(row.partition("=@")[2]) or not Path(shlex.split(row.partition("=@")[2])[0]).is_file():
                common.refuse(f"row {row!r}: NAME=@CONFIG needs a config file that exists")
        elif "=" in row:
            positions.scheme(row.partition("=")[2])
        elif row not in ("none", "yarn", "yarn_switched", "dca"):
            common.refuse(f"a row is none, yarn, yarn_switched, dca or NAME=POSITIONS (a fine-tune), got {row!r}")
    if not all(0 <= d <= 1 for d in args.depths):
        common.refuse(f"--depths are fractions in [0, 1], got {args.depths}")
    args.dtype = common.dtype_name(args.dtype)
    results, save = common.results_file(args.out, {"target": TARGET, "lengths": LENGTHS, "late": LATE,
                                                   "window": WINDOW, "dtype": args.dtype,
                                                   "train_args": args.train_args, "depths": args.depths},
                                        ["finetune", "perplexity", "passkey"])
    if args.report:
        return report(results, args.figure)
    here = f"{common.machine()}, SmolLM2-135M {args.dtype} sdpa"
    results.setdefault("machine", here)
    print(here, flush=True)
    # A cell measured on another CPU than the file's first cells says so; the report marks its row.
    elsewhere = {} if common.cpu_name() in results["machine"] else {"machine": here}

    if args.only in (None, "train"):   # 1. the fine-tunes
        check_finetunes([r for r in args.rows if "=" in r and row_name(r) not in results["finetune"]], args)
        for row in [r for r in args.rows if "=" in r and row_name(r) not in results["finetune"]]:
            results["finetune"][row_name(row)] = {**finetune(row, args), **elsewhere}
            save()
            print(f"finetune {row}: {results['finetune'][row_name(row)]}", flush=True)
    dtype = getattr(torch, args.dtype)
    if args.only in (None, "perplexity"):   # 2. perplexity and late-token loss, each (row, play)
        _, tokenizer = common.smollm2(args.dtype)
        docs = held_out(tokenizer, args.plays)
        for row in args.rows:
            todo = [p for p in docs if f"{row_name(row)} {p}" not in results["perplexity"]]
            if not todo or ("=" in row and row_name(row) not in results["finetune"]):
                continue
            model = load_row(row, args, dtype)
            for play in todo:
                start = time.perf_counter()
                cell = perplexity_cell(model, docs[play])
                results["perplexity"][f"{row_name(row)} {play}"] = {**cell, "seconds": time.perf_counter() - start,
                                                                     **elsewhere}
                save()
                print(f"{row_name(row)} {play}: {cell}", flush=True)
    if args.only in (None, "passkey"):   # 3. the passkey at 32768
        _, tokenizer = common.smollm2(args.dtype)
        trials = hpe.make_trials("passkey", tokenizer, lengths=[TARGET], depths=args.depths, trials=1, seed=0)
        for row in args.rows:
            if row_name(row) in results["passkey"] or ("=" in row and row_name(row) not in results["finetune"]):
                continue
            model = load_row(row, args, dtype)
            scores = hpe.score_trials(model, trials, progress=False)
            summary = hpe.summarize(trials, scores)
            results["passkey"][row_name(row)] = {"found": sum(bool(s["correct"]) for s in scores),
                                                 "trials": len(trials), "mean_logprob": summary["mean_logprob"],
                                                 "logprobs": [s["logprob"] for s in scores], **elsewhere}
            save()
            print(f"passkey {row_name(row)}: {results['passkey'][row_name(row)]}", flush=True)
    print(table(results))


def table(results: dict) -> str:
    plays = sorted({key.split(" ", 1)[1] for key in results["perplexity"]})
    rows = list(dict.fromkeys(key.split(" ", 1)[0] for key in [*results["perplexity"], *results["passkey"]]))
    notes: list[str] = []   # the machines of cells measured elsewhere than the file's first cells

    def mark(cell: dict | None) -> str:
        if not cell or "machine" not in cell:
            return ""
        machine = re.sub(r", load average [\d.]+", "", cell["machine"])   # the machine, not its moment
        if machine not in notes:
            notes.append(machine)
        return f" [{notes.index(machine) + 1}]"

    lines = [f"{results.get('machine', '')}", "",
             "| row | text | ppl@2048 | ppl@8192 | ppl@32768 | late loss, full prefix | late loss, 16k window "
             "| passkey@32768 |", "|---|---|---|---|---|---|---|---|"]
    for row in rows:
        key = results["passkey"].get(row)
        passkey = f"{key['found']}/{key['trials']}{mark(key)}" if key else ""
        if key and "logprobs" in key:   # the answer's log-prob, mean and 95 % interval over the trials
            passkey += f", log-prob {stats.interval_text(stats.bootstrap_mean(key['logprobs']))}"
        for play in plays:
            cell = results["perplexity"].get(f"{row} {play}")
            if cell is None:
                continue
            p = cell["perplexity"]
            lines.append(f"| {row}{mark(cell)} | {play} | {p['2048']:.2f} | {p['8192']:.2f} | {p['32768']:.2f} | "
                         f"{cell['late_loss_full']:.3f} | {cell['late_loss_16k']:.3f} | "
                         f"{passkey} |")
    lines += goal(results)
    if results["finetune"]:
        lines += ["", "| fine-tune | positions | steps | tokens | wall (s) | tokens/s | peak memory (MB) |",
                  "|---|---|---|---|---|---|---|"]
        lines += [f"| {name}{mark(f)} | `{f['positions']}` | {f['steps']} | {f['tokens']} | {f['seconds']:.0f} | "
                  f"{f['tokens_per_s']:.0f} | {f['peak_mem_mb']:.0f} |" for name, f in results["finetune"].items()]
    if notes:
        lines += ["", *[f"[{i}] measured on: {machine}" for i, machine in enumerate(notes, 1)]]
    return "\n".join(lines)


def goal(results: dict, control: str = "contiguous") -> list[str]:
    """Issue 22's goal, row by row against the control (the same text, steps and tokens with ids 0..n-1):
    ppl@32768 at least 10 % below the control's and ppl@2048 at most 2 % above it, on every play; the late
    tokens' loss lower with the whole prefix than with the 16k window, on every play; the passkey at 32768
    found at least 4 times in 5."""
    cells, passkey = results["perplexity"], results["passkey"]
    plays = sorted({key.split(" ", 1)[1] for key in cells})
    lines = []
    for row in [r for r in results["finetune"] if r != control]:
        checks = []
        for play in plays:
            mine, bar = cells.get(f"{row} {play}"), cells.get(f"{control} {play}")
            if mine and bar:
                long = mine["perplexity"]["32768"] / bar["perplexity"]["32768"] - 1
                short = mine["perplexity"]["2048"] / bar["perplexity"]["2048"] - 1
                checks.append(f"{play}: ppl@32768 {long:+.1%} vs the control (goal <= -10 %) "
                              f"{'met' if long <= -0.10 else 'missed'}, ppl@2048 {short:+.1%} (goal <= +2 %) "
                              f"{'met' if short <= 0.02 else 'missed'}")
            if mine:
                gap = mine["late_loss_full"] - mine["late_loss_16k"]
                checks.append(f"{play}: late loss full - 16k window {gap:+.3f} nats (goal < 0) "
                              f"{'met' if gap < 0 else 'missed'}")
        if row in passkey:
            found = passkey[row]["found"]
            checks.append(f"passkey@32768 {found}/{passkey[row]['trials']} (goal >= 4/5) "
                          f"{'met' if found >= 4 else 'missed'}")
            mine, bar = passkey[row].get("logprobs"), passkey.get(control, {}).get("logprobs")
            if mine and bar and len(mine) == len(bar):   # the same trials: paired
                d = stats.paired_difference(mine, bar)
                checks.append(f"passkey@32768 answer log-prob - the control's (n {d['n']}, 95 %): {d['mean']:+.2f} "
                              f"[{d['low']:+.2f}, {d['high']:+.2f}] {'differs' if d['differs'] else 'no difference'}")
        if checks:
            lines += ["", f"goal, {row}:", *[f"- {c}" for c in checks]]
    return lines


def report(results: dict, figure: str | None) -> None:
    print(table(results))
    if figure:
        import matplotlib
        import matplotlib.ticker

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        plays = sorted({key.split(" ", 1)[1] for key in results["perplexity"]})
        fig, axes = plt.subplots(1, len(plays), figsize=(6 * len(plays), 4.2), squeeze=False)
        for ax, play in zip(axes[0], plays):
            for key, cell in results["perplexity"].items():
                if key.endswith(" " + play):
                    row = key.split(" ", 1)[0]
                    # the unpatched model only inside its own 8k: past it its perplexity leaves the plot
                    lengths = [n for n in LENGTHS if row != "none" or n <= ORIGINAL]
                    ax.plot(lengths, [cell["perplexity"][str(n)] for n in lengths], marker="o",
                            label="none (unpatched, inside 8k)" if row == "none" else row)
            ax.axvline(8192, color="grey", linestyle=":", linewidth=1)
            ax.set(xscale="log", xticks=LENGTHS, xticklabels=[str(n) for n in LENGTHS], xlabel="first n tokens",
                   ylabel="perplexity", title=f"SmolLM2-135M to 32k, {play} (held out)")
            ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())   # the log axis' own labels overlap
        # one legend beside the plots: inside, every corner hides a row
        fig.legend(*axes[0][0].get_legend_handles_labels(), fontsize=8, loc="center right")
        fig.tight_layout(rect=(0, 0, 0.83, 1))
        fig.savefig(figure, dpi=110)
        print(f"figure: {figure}")


def schemes_figure(path: str, window: int = 2048, seed: int = 0) -> None:
    """Position id against token index in one window, for each scheme (two draws each)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(positions.SCHEMES)
    fig, axes = plt.subplots(1, len(names), figsize=(3.3 * len(names), 3.3), sharey=True)
    for ax, name in zip(axes, names):
        scheme = positions.scheme(name, target=TARGET)
        for index, style in ((1, "-"), (2, "--")):
            ax.plot(scheme.position_ids(window, seed=seed, index=index).numpy(), style, linewidth=1.6,
                    label=f"window {index}")
        ax.axhline(8192, color="grey", linestyle=":", linewidth=1)
        ax.set(title=scheme.spec.replace(f" target={TARGET}", ""), xlabel=f"token in the {window}-token window")
        ax.legend(fontsize=7, loc="upper left")
    axes[0].set_ylabel("position id")
    fig.suptitle(f"The ids of two {window}-token windows, target {TARGET} (dotted: SmolLM2's original 8192)",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"figure: {path}")


if __name__ == "__main__":
    common.run(main)
