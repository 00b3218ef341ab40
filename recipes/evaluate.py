"""Evaluate positional variants of one model: perplexity by position, perplexity with a sliding window,
passkey and needle retrieval. Writes results.json (after every variant: a rerun resumes), summary.md
and figures to output_dir.

    python recipes/evaluate.py --config recipes/configs/eval_smollm2.yaml
    python recipes/evaluate.py --config recipes/configs/eval_smollm2.yaml --variants none yarn --curve_length 4096

Every field of EvalArguments is a YAML key and a command-line flag (the flag wins). Variants are
"none" (the model as loaded) or a method with parameters ("yarn", "yarn beta_fast=16"); each runs at
every target in max_position_embeddings (several targets make a sweep)."""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import platform
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
import transformers
import yaml
from transformers import HfArgumentParser

import hf_posenc as hp
from hf_posenc import assets, data
from hf_posenc import eval as hpe


@dataclass
class EvalArguments:
    model: str = field(default="smollm2", metadata={"help": "hub id, folder, .gguf file, or 'smollm2' (embedded)"})
    dtype: str = field(default="bfloat16", metadata={"help": "float32, bfloat16 or float16"})
    attn_implementation: str = "sdpa"
    variants: list[str] = field(default_factory=lambda: ["none", "yarn"],
                                metadata={"help": "'none' or a method with parameters: 'yarn beta_fast=16'"})
    max_position_embeddings: list[int] = field(default_factory=lambda: [16384],
                                               metadata={"help": "target context(s) of the patched variants"})
    corpus: str = field(default="shakespeare", metadata={"help": "a load_corpus spec (see hf_posenc/data.py)"})
    corpus_split: str = "train"
    text_column: str = "text"
    curve_length: int = field(default=0, metadata={"help": "tokens of the perplexity-by-position curve (0: skip)"})
    curve_documents: int = field(default=1, metadata={"help": "documents averaged in the curve"})
    curve_bucket: int = field(default=512, metadata={"help": "positions per point of the curve"})
    strided_windows: list[int] = field(default_factory=list,
                                       metadata={"help": "sliding-window perplexity at each window length"})
    strided_stride: int = field(default=0, metadata={"help": "stride of the sliding window (0: half the window)"})
    strided_tokens: int = field(default=32768, metadata={"help": "tokens of text the sliding window scores"})
    passkey_lengths: list[int] = field(default_factory=list, metadata={"help": "passkey context lengths"})
    needle_lengths: list[int] = field(default_factory=list, metadata={"help": "needle context lengths"})
    depths: list[float] = field(default_factory=lambda: [0.1, 0.5, 0.9],
                                metadata={"help": "where the passkey / needle is hidden (fraction of the haystack)"})
    trials: int = field(default=1, metadata={"help": "retrieval trials per (length, depth)"})
    seed: int = 0
    output_dir: str = "runs/eval"
    resume: bool = field(default=True, metadata={"help": "skip the variants results.json already holds"})
    plots: bool = True


OUTPUT_ONLY = ("output_dir", "resume", "plots")  # fields that do not change what is measured


def parse_args(argv: list[str] | None = None) -> EvalArguments:
    """YAML (--config) first, then the command line over it."""
    parser = HfArgumentParser(EvalArguments, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", help="a YAML file whose keys are the flags below")
    config = argparse.ArgumentParser(add_help=False)
    config.add_argument("--config")
    path = config.parse_known_args(argv)[0].config
    if path:
        values = yaml.safe_load(Path(path).read_text()) or {}
        unknown = sorted(set(values) - {f.name for f in dataclasses.fields(EvalArguments)})
        if unknown:
            raise SystemExit(f"{path}: unknown key(s) {unknown}; the keys are the fields of EvalArguments (--help)")
        parser.set_defaults(**values)
    args = parser.parse_args_into_dataclasses(argv)[0]
    for spec in args.variants:
        hpe.parse_variant(spec)  # an unknown method stops here, before any loading
    return args


def variant_plan(args: EvalArguments) -> list[tuple[str, str, int]]:
    """(label, spec, target) for each evaluation: "none" once, the others at each target."""
    sweep = len(args.max_position_embeddings) > 1
    return [(spec if spec == hpe.variants.NONE or not sweep else f"{spec} @{target}", spec, target)
            for spec in args.variants
            for target in (args.max_position_embeddings[:1] if spec == hpe.variants.NONE else args.max_position_embeddings)]


def prepare_data(args: EvalArguments, tokenizer) -> dict:
    """Token ids for the curve and the sliding window, the haystack text, the retrieval trials."""
    corpus = data.load_corpus(args.corpus, split=args.corpus_split, text_column=args.text_column)
    tokenized = data.tokenize(corpus, tokenizer)
    out = {"curve": [], "strided": [], "trials": {}}
    if args.curve_length:
        long_docs = [ids for ids, n in zip(tokenized["input_ids"], tokenized["num_tokens"]) if n >= args.curve_length]
        if len(long_docs) < args.curve_documents:
            raise SystemExit(f"corpus {args.corpus!r} has {len(long_docs)} documents of >= {args.curve_length} tokens; "
                             f"curve_documents={args.curve_documents} needs more (lower curve_length or curve_documents)")
        out["curve"] = long_docs[:args.curve_documents]
    if args.strided_windows:
        eos = [] if tokenizer.eos_token_id is None else [tokenizer.eos_token_id]
        stream = [t for ids in tokenized["input_ids"] for t in ids + eos]
        out["strided"] = stream[:args.strided_tokens]
    for task, lengths in (("passkey", args.passkey_lengths), ("needle", args.needle_lengths)):
        if lengths:  # the needle hides in the corpus text: enough of it for the longest prompt
            haystack = "\n".join(corpus["text"])[:16 * max(lengths)] if task == "needle" else None
            out["trials"][task] = hpe.make_trials(task, tokenizer, lengths=lengths, depths=args.depths,
                                                  trials=args.trials, haystack=haystack, seed=args.seed)
    return out


def describe(model) -> dict:
    """hp.describe, or just the model type for a model hf_posenc cannot patch (it can still run "none")."""
    try:
        return hp.describe(model)
    except hp.PosEncError as err:
        return {"model_type": model.config.model_type, "note": str(err)}


def evaluate_variant(model, args: EvalArguments, inputs: dict) -> dict:
    res = {}
    if inputs["curve"]:
        res["curve"] = hpe.perplexity_curve(model, inputs["curve"], length=args.curve_length, bucket=args.curve_bucket)
    for window in args.strided_windows:
        res.setdefault("strided", {})[str(window)] = hpe.strided_perplexity(
            model, inputs["strided"], window=window, stride=args.strided_stride or window // 2)
    for task, trials in inputs["trials"].items():
        res[task] = hpe.summarize(trials, hpe.score_trials(model, trials))
    return res


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    results_path = out / "results.json"

    ref = assets.resolve_alias(args.model)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = hp.load_model(ref, dtype=getattr(torch, args.dtype), attn_implementation=args.attn_implementation)
    model = model.to(device).eval()
    tokenizer = hp.load_tokenizer(ref)
    context = model.config.get_text_config().max_position_embeddings
    inputs = prepare_data(args, tokenizer)

    config = dataclasses.asdict(args)
    results = {"config": config, "model": describe(model), "variants": {}}
    if args.resume and results_path.exists():
        saved = json.loads(results_path.read_text())
        same = lambda c: {k: v for k, v in c.items() if k not in OUTPUT_ONLY}  # noqa: E731
        if same(saved["config"]) == same(config):
            results["variants"] = saved["variants"]
        else:
            print(f"{results_path} holds another configuration: starting over", file=sys.stderr)
    results["machine"] = {"date": datetime.date.today().isoformat(), "device": device, "python": platform.python_version(),
                          "torch": torch.__version__, "transformers": transformers.__version__,
                          "platform": platform.platform(), "cpu_threads": torch.get_num_threads()}

    for label, spec, target in variant_plan(args):
        if label in results["variants"]:
            print(f"{label}: done already (results.json), skipped", file=sys.stderr)
            continue
        print(f"== {label}", file=sys.stderr)
        start = time.perf_counter()
        with hpe.patched(model, spec, target) as params:
            res = {"params": params, "describe": describe(model), **evaluate_variant(model, args, inputs)}
        res.update(seconds=round(time.perf_counter() - start, 1), date=datetime.date.today().isoformat(), device=device)
        results["variants"][label] = res
        results_path.write_text(json.dumps(results, indent=1, default=str))

    (out / "summary.md").write_text(summary(results, context))
    if args.plots:
        figures(results, out, context)
    print((out / "summary.md").read_text())
    return results


def _fmt(x: float) -> str:
    return f"{x:.3g}" if x == x else "-"


def summary(results: dict, context: int) -> str:
    """Markdown tables: perplexity inside and past the original context, sliding window, retrieval."""
    variants, machine = results["variants"], results["machine"]
    lines = [f"# {results['config']['model']}: positional variants", "",
             f"{machine['date']}, {machine['device']} ({machine['platform']}), torch {machine['torch']}, "
             f"transformers {machine['transformers']}, {results['config']['dtype']}; original context {context}.", ""]
    curves = {k: v["curve"] for k, v in variants.items() if "curve" in v}
    if curves:
        length = next(iter(curves.values()))["length"]
        lines += [f"Perplexity by position ({length} tokens, {next(iter(curves.values()))['documents']} document(s), "
                  f"corpus {results['config']['corpus']}):", "",
                  "| variant | positions < " + str(context) + " | positions >= " + str(context) + " | last bucket | time (s) |",
                  "|---|---|---|---|---|"]
        for label, curve in curves.items():
            lines.append(f"| {label} | {_fmt(hpe.curve_perplexity(curve, 0, context))} | "
                         f"{_fmt(hpe.curve_perplexity(curve, context))} | {_fmt(curve['perplexity'][-1])} | "
                         f"{variants[label]['seconds']} |")
        lines.append("")
    strided = {k: v["strided"] for k, v in variants.items() if "strided" in v}
    if strided:
        windows = list(next(iter(strided.values())))
        lines += ["Sliding-window perplexity (window = context the model sees):", "",
                  "| variant | " + " | ".join(f"window {w}" for w in windows) + " |", "|---|" + "---|" * len(windows)]
        lines += [f"| {label} | " + " | ".join(_fmt(s[w]["perplexity"]) for w in windows) + " |"
                  for label, s in strided.items()]
        lines.append("")
    for task in hpe.TASKS:
        runs = {k: v[task] for k, v in variants.items() if task in v}
        if runs:
            first = next(iter(runs.values()))
            per_length = first["trials"] // len(first["lengths"])
            lines += [f"{task} accuracy at each length ({per_length} trials per length, depths {first['depths']}):", "",
                      "| variant | " + " | ".join(str(n) for n in first["lengths"]) + " | mean answer log-prob |",
                      "|---|" + "---|" * (len(first["lengths"]) + 1)]
            lines += [f"| {label} | " + " | ".join(f"{a:.2f}" for a in r["by_length"]) + f" | {r['mean_logprob']:.2f} |"
                      for label, r in runs.items()]
            lines.append("")
    return "\n".join(lines)


def figures(results: dict, out: Path, context: int) -> None:
    from hf_posenc.eval import plots

    variants, model = results["variants"], results["config"]["model"]
    curves = {k: v["curve"] for k, v in variants.items() if "curve" in v}
    if curves:
        plots.plot_perplexity_curves(curves, out / "perplexity_curve.png", original_context=context,
                                     title=f"{Path(model).name}: perplexity by position")
    for task in hpe.TASKS:
        runs = {k: v[task] for k, v in variants.items() if task in v}
        if runs:
            plots.plot_retrieval_by_length(runs, out / f"{task}.png", original_context=context,
                                           title=f"{Path(model).name}: {task} accuracy")
            plots.plot_retrieval_depths(runs, out / f"{task}_depths.png", title=f"{Path(model).name}: {task} accuracy")


if __name__ == "__main__":
    main()
