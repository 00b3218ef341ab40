"""Evaluate positional variants of one model: perplexity against context length, perplexity by position,
perplexity with a sliding window, passkey and needle retrieval, and parameter grids tuned on some
documents and checked on others. Writes results.json (after every variant: a rerun resumes), summary.md
and figures to output_dir.

    python recipes/evaluate.py --config recipes/configs/eval_smollm2.yaml
    python recipes/evaluate.py --config recipes/configs/eval_smollm2.yaml --variants none yarn --curve_length 4096

Every field of EvalArguments is a YAML key and a command-line flag (the flag wins). Variants are
"none" (the model as loaded) or a method with parameters ("yarn", "yarn beta_fast=16"); each runs at
every target in max_position_embeddings (several targets make a sweep). Documents and prompts start as
the tokenizer starts an input (framing: BOS first for Llama, Gemma, Mistral), recorded in results.json.
A configuration that cannot run is refused before anything is written (most of it before the model
loads): one line `error: ...` on stderr, exit code 2."""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import platform
import sys
import time
import typing
from dataclasses import dataclass, field
from pathlib import Path

import torch
import transformers
import yaml
from tqdm.auto import tqdm
from transformers import HfArgumentParser

import hf_posenc as hp
from hf_posenc import cli, data, loading
from hf_posenc import eval as hpe
from hf_posenc.eval import report


@dataclass
class EvalArguments:
    model: str = field(default="smollm2", metadata={"help": "hub id, folder, .gguf file, or 'smollm2' (embedded)"})
    dtype: str = field(default="auto", metadata={"help": "auto (bfloat16 where the hardware runs it natively, "
                                                         "else float32), float32, bfloat16 or float16"})
    framing: str = field(default="auto", metadata={
        "help": "what starts each document and prompt: auto (as the tokenizer starts an input: BOS for Llama, "
                "Gemma, Mistral; nothing for GPT-2, SmolLM2), bos (the tokenizer's BOS token), none"})
    attn_implementation: str = "sdpa"
    variants: list[str] = field(default_factory=lambda: ["none", "yarn"],
                                metadata={"help": "'none' or a method with parameters: 'yarn beta_fast=16'"})
    max_position_embeddings: list[int] = field(default_factory=lambda: [16384],
                                               metadata={"help": "target context(s) of the patched variants"})
    corpus: str = field(default="shakespeare", metadata={"help": "a load_corpus spec (see hf_posenc/data.py)"})
    corpus_split: str = "train"
    text_column: str = "text"
    perplexity_lengths: list[int] = field(default_factory=list, metadata={
        "help": "per-document perplexity of each document truncated to each length (the papers' measure)"})
    perplexity_documents: int = field(default=2, metadata={"help": "documents scored at perplexity_lengths"})
    grid: list[str] = field(default_factory=list, metadata={
        "help": "parameter grids, 'yarn beta_fast=16|32 attention_factor=1|1.1': every point is scored on the "
                "tuning documents, the best one evaluated as a variant on the held-out ones"})
    tune_documents: int = field(default=1, metadata={"help": "documents the grid is scored on (held out from the rest)"})
    tune_length: int = field(default=0, metadata={"help": "tokens the grid is scored at (0: the longest perplexity length)"})
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
    overwrite: bool = field(default=False, metadata={"help": "replace a results.json of another configuration"})
    plots: bool = True


OUTPUT_ONLY = ("output_dir", "resume", "overwrite", "plots")  # fields that do not change what is measured
DTYPES = ("auto", "float32", "bfloat16", "float16")
FRAMINGS = {"auto": "auto", "bos": True, "none": False}  # -> data.bos_prefix's bos=
MEASURES = ("perplexity_lengths", "curve_length", "strided_windows", "passkey_lengths", "needle_lengths", "grid")


class EvalConfigError(ValueError):
    """A configuration the recipe cannot run; raised before the model loads or anything is written."""


class ArgumentParser(HfArgumentParser):
    def error(self, message: str):  # argparse's own refusals: one line, exit code 2, like every other one
        cli.refuse(f"{message} (see --help)")


def parse_args(argv: list[str] | None = None) -> EvalArguments:
    """YAML (--config) first, then the command line over it; every value checked (`check_args`)."""
    parser = ArgumentParser(EvalArguments, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", help="a YAML file whose keys are the flags below")
    config = ArgumentParser((), add_help=False)
    config.add_argument("--config")
    path = config.parse_known_args(argv)[0].config
    if path:
        parser.set_defaults(**read_config(path))
    args = parser.parse_args_into_dataclasses(argv)[0]
    check_args(args)
    return args


def read_config(path: str) -> dict:
    """The YAML file's (or the shipped config's of that name) keys, each checked against the type of its field."""
    from hf_posenc.recipes import config_path, shipped_configs

    found = config_path(path)
    if found is None:
        raise EvalConfigError(f"config file not found: {path} (nor a shipped config: "
                              f"{', '.join(n for n in shipped_configs() if n.startswith('eval_'))})")
    path = str(found)
    try:
        values = yaml.safe_load(Path(path).read_text())
    except yaml.YAMLError as err:
        raise EvalConfigError(f"{path} is not valid YAML: {' '.join(str(err).split())}") from None
    values = {} if values is None else values
    if not isinstance(values, dict):
        raise EvalConfigError(f"{path} must be a mapping of keys (model: ..., variants: [...]), got {values!r}")
    fields = {f.name for f in dataclasses.fields(EvalArguments)}
    unknown = sorted(set(values) - fields, key=str)
    if unknown:
        raise EvalConfigError(f"{path}: unknown key(s) {unknown}; the keys are: "
                              f"{', '.join(f.name for f in dataclasses.fields(EvalArguments))}")
    hints = typing.get_type_hints(EvalArguments)
    for key, value in values.items():
        if not _is_a(value, hints[key]):
            raise EvalConfigError(f"{path}: {key} must be {_type_name(hints[key])}, got {value!r}")
    return values


def _is_a(value, hint) -> bool:
    if typing.get_origin(hint) is list:
        return isinstance(value, list) and all(_is_a(v, typing.get_args(hint)[0]) for v in value)
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, hint)


def _type_name(hint) -> str:
    names = {int: "an integer", float: "a number", str: "a string", bool: "true or false"}
    if typing.get_origin(hint) is list:
        item = typing.get_args(hint)[0]
        return f"a list of {names[item].split(' ', 1)[1]}s (YAML [a, b, ...], even for one)"
    return names[hint]


def check_args(args: EvalArguments) -> None:
    """Every value in range, before anything is loaded or written."""
    def need(ok: bool, message: str) -> None:
        if not ok:
            raise EvalConfigError(message)

    need(args.dtype in DTYPES, f"dtype must be one of {', '.join(DTYPES)}, got {args.dtype!r}")
    need(args.framing in FRAMINGS, f"framing must be one of {', '.join(FRAMINGS)}, got {args.framing!r}")
    for name in ("model", "attn_implementation", "corpus", "corpus_split", "text_column", "output_dir"):
        need(bool(getattr(args, name).strip()), f"{name} is empty")
    need(bool(args.variants), "variants is empty: nothing to evaluate; give at least one, e.g. [none, yarn]")
    need(bool(args.max_position_embeddings),
         "max_position_embeddings is empty: give the target context(s) of the patched variants, e.g. [16384]")
    for spec in args.variants:
        hpe.parse_variant(spec)  # an unknown method stops here, before any loading
    for spec in args.grid:
        hpe.expand_grid(spec)
    for name in ("variants", "max_position_embeddings", "grid"):
        values = getattr(args, name)
        need(len(set(values)) == len(values), f"{name} lists a value twice: {values}")
    for name, least in (("max_position_embeddings", 2), ("perplexity_lengths", 2), ("strided_windows", 2),
                        ("passkey_lengths", 1), ("needle_lengths", 1)):
        values = getattr(args, name)
        need(all(v >= least for v in values), f"{name} must hold token counts >= {least}, got {values}")
    for name in ("perplexity_documents", "tune_documents", "curve_documents", "curve_bucket", "trials"):
        need(getattr(args, name) >= 1, f"{name} must be >= 1, got {getattr(args, name)}")
    for name in ("tune_length", "curve_length"):
        value = getattr(args, name)
        need(value == 0 or value >= 2, f"{name} must be 0 (off) or a token count >= 2, got {value}")
    need(args.strided_tokens >= 2, f"strided_tokens must be >= 2, got {args.strided_tokens}")
    need(0 <= args.strided_stride <= min(args.strided_windows, default=args.strided_stride),
         f"strided_stride must be 0 (half the window) or in 1..{min(args.strided_windows, default=0)} (the "
         f"smallest of strided_windows), got {args.strided_stride}")
    need(all(0 <= d <= 1 for d in args.depths), f"depths must be fractions in [0, 1], got {args.depths}")
    need(bool(args.depths) or not (args.passkey_lengths or args.needle_lengths),
         "depths is empty; passkey_lengths / needle_lengths need at least one depth")
    need(any(getattr(args, name) for name in MEASURES),
         f"nothing to measure: set at least one of {', '.join(MEASURES)}")
    need(not args.grid or bool(args.tune_length or args.perplexity_lengths),
         "grid needs tune_length (or perplexity_lengths, whose longest is the default)")


def check_model_and_paths(args: EvalArguments) -> str:
    """The model reference (checked like the CLI's) and, from its config alone, that every variant's method
    applies to it; output_dir neither a file nor an input. Returns the reference."""
    ref = cli.model_ref(args.model)
    inputs = [p for p in (Path(ref), Path(args.corpus)) if p.is_dir()]
    cli.output_folder(args.output_dir, "output_dir", inputs)
    methods = {spec.split()[0] for spec in [*args.variants, *args.grid]} - {hpe.variants.NONE}
    cli.model_mechanism(ref, methods=sorted(methods))
    return ref


def max_length(args: EvalArguments) -> int:
    """The longest input any measure asks of the model."""
    return max([args.curve_length, args.tune_length, *args.perplexity_lengths, *args.strided_windows,
                *args.passkey_lengths, *args.needle_lengths])


def variant_plan(args: EvalArguments) -> list[tuple[str, str, int]]:
    """(label, spec, target) for each evaluation: "none" once, the others at each target."""
    sweep = len(args.max_position_embeddings) > 1
    return [(spec if spec == hpe.variants.NONE or not sweep else f"{spec} @{target}", spec, target)
            for spec in args.variants
            for target in (args.max_position_embeddings[:1] if spec == hpe.variants.NONE else args.max_position_embeddings)]


def prepare_data(args: EvalArguments, tokenizer) -> dict:
    """Token ids for each measure, the haystack text, the retrieval trials. With a grid, the first
    tune_documents long enough are the tuning split, and the other perplexity measures read only the
    documents after them (held out). Each document and prompt starts as `framing` says (by default as the
    tokenizer starts an input); the sliding window puts that BOS before every window instead."""
    corpus = data.load_corpus(args.corpus, split=args.corpus_split, text_column=args.text_column)
    bos = FRAMINGS[args.framing]
    prefix = data.bos_prefix(tokenizer, bos)
    tokenized = data.tokenize(corpus, tokenizer, bos=bos)
    names = corpus["title"] if "title" in corpus.column_names else [f"#{i}" for i in range(len(corpus))]
    docs = list(zip(names, tokenized["input_ids"]))
    out = {"tune": [], "lengths": [], "curve": [], "strided": [], "trials": {},
           "framing": "bos" if prefix else "none", "bos": prefix[0] if prefix else None}
    if args.grid:
        length = args.tune_length or max(args.perplexity_lengths)
        out["tune"], docs = take(docs, length, args.tune_documents, "tune_documents", args.corpus)
    if args.perplexity_lengths:
        out["lengths"], _ = take(docs, max(args.perplexity_lengths), args.perplexity_documents,
                                 "perplexity_documents", args.corpus)
    if args.curve_length:
        out["curve"], _ = take(docs, args.curve_length, args.curve_documents, "curve_documents", args.corpus)
    if args.strided_windows:
        eos = [] if tokenizer.eos_token_id is None else [tokenizer.eos_token_id]
        stream = [t for _, ids in docs for t in ids[len(prefix):] + eos]
        out["strided"] = stream[:args.strided_tokens]
        stride, window = args.strided_stride, min(args.strided_windows)
        if prefix and stride >= window:
            raise EvalConfigError(f"strided_stride={stride}: with the BOS before every window, a window of {window} "
                                  f"holds {window - 1} tokens of text; use a stride of at most {window - 1}")
    for task, lengths in (("passkey", args.passkey_lengths), ("needle", args.needle_lengths)):
        if lengths:  # the needle hides in the corpus text: enough of it for the longest prompt
            haystack = "\n".join(corpus["text"])[:16 * max(lengths)] if task == "needle" else None
            try:
                out["trials"][task] = hpe.make_trials(task, tokenizer, lengths=lengths, depths=args.depths,
                                                      trials=args.trials, haystack=haystack, seed=args.seed, bos=bos)
            except ValueError as err:
                raise EvalConfigError(f"{task}_lengths {lengths}: {err}") from None
    return out


def take(docs: list, length: int, count: int, field_name: str, corpus: str) -> tuple[list, list]:
    """The token ids of the first `count` documents with >= `length` tokens, and the documents after the
    last one taken. Too few: stop, naming the documents that were too short."""
    chosen, last = [], -1
    for i, (_, ids) in enumerate(docs):
        if len(ids) >= length and len(chosen) < count:
            chosen.append(ids)
            last = i
    if len(chosen) < count:
        short = [f"{name} ({len(ids)})" for name, ids in docs if len(ids) < length]
        listed = ", ".join(short[:10]) + (f" and {len(short) - 10} more" if len(short) > 10 else "")
        raise EvalConfigError(f"corpus {corpus!r}: {field_name}={count} needs {count} documents of >= {length} "
                              f"tokens, {len(chosen)} have them; too short (tokens): {listed or 'no documents'}. Use "
                              f"a shorter length, fewer documents, or a corpus with longer ones")
    return chosen, docs[last + 1:]


def describe(model) -> dict:
    """hp.describe, or just the model type for a model hf_posenc cannot patch (it can still run "none")."""
    try:
        return hp.describe(model)
    except hp.PosEncError as err:
        return {"model_type": model.config.model_type, "note": str(err)}


def evaluate_variant(model, args: EvalArguments, inputs: dict) -> dict:
    """Every measure of one variant, and the seconds each took ("seconds_by_measure")."""
    res, seconds = {}, {}

    def timed(name, fn):
        start = time.perf_counter()
        value = fn()
        seconds[name] = round(time.perf_counter() - start, 1)
        return value

    if inputs["lengths"]:
        res["lengths"] = timed("lengths", lambda: hpe.perplexity_by_length(model, inputs["lengths"],
                                                                           args.perplexity_lengths))
    if inputs["curve"]:
        res["curve"] = timed("curve", lambda: hpe.perplexity_curve(model, inputs["curve"], length=args.curve_length,
                                                                   bucket=args.curve_bucket))
    for window in args.strided_windows:
        res.setdefault("strided", {})[str(window)] = timed(f"strided {window}", lambda: hpe.strided_perplexity(
            model, inputs["strided"], window=window, stride=args.strided_stride or window // 2, bos=inputs["bos"]))
    for task, trials in inputs["trials"].items():
        res[task] = timed(task, lambda: hpe.summarize(trials, hpe.score_trials(model, trials)))
    res["seconds_by_measure"] = seconds
    return res


def search_grid(model, args: EvalArguments, inputs: dict, spec: str, target: int) -> dict:
    """Every point of one grid scored on the tuning documents (perplexity at tune_length); the best
    named as the hp.patch call that makes it."""
    length = args.tune_length or max(args.perplexity_lengths)
    points = []
    for point in tqdm(hpe.expand_grid(spec), desc=f"grid {spec} @{target}", unit="point"):
        with hpe.patched(model, point, target) as params:
            ppl = hpe.perplexity_by_length(model, inputs["tune"], [length], progress=False)["perplexity"][0]
        points.append({"variant": point, "params": params, "perplexity": ppl})
    best = min(points, key=lambda p: p["perplexity"])
    method = best["variant"].split()[0]
    call = ", ".join([f"{method!r}", *(f"{k}={v!r}" for k, v in best["params"].items())])
    return {"length": length, "documents": len(inputs["tune"]), "target": target, "points": points,
            "best": best["variant"], "patch": f"hp.patch(model, {call})"}


def check_lengths(model, args: EvalArguments, plan: list[tuple[str, str, int]]) -> None:
    """Every variant takes the longest input asked of it (a learned table may not): refused before any
    measure runs."""
    longest = max_length(args)
    for label, spec, target in plan:
        with hpe.patched(model, spec, target):
            try:
                hp.check_length(model, longest)
            except hp.SequenceTooLongError as err:
                raise EvalConfigError(f"variant {label!r} cannot take the {longest} tokens this configuration "
                                      f"asks for: {err}") from None


def previous_results(path: Path, config: dict, args: EvalArguments) -> dict:
    """What results.json holds of this configuration (to resume from); a file of another configuration
    is only replaced with --overwrite (checked before anything is loaded)."""
    if not path.exists():
        return {}
    try:
        saved = json.loads(path.read_text())
    except ValueError as err:
        saved = err
    if not isinstance(saved, dict):
        raise EvalConfigError(f"{path} is not a results file of this recipe ({saved}); remove it or choose "
                              f"another --output_dir")
    same = lambda c: {k: v for k, v in c.items() if k not in OUTPUT_ONLY}  # noqa: E731
    if args.resume and same(saved.get("config", {})) == same(config):
        return saved
    if not args.overwrite:
        why = "another configuration" if same(saved.get("config", {})) != same(config) else "results (resume is off)"
        raise EvalConfigError(f"{path} already holds {why}: pass --overwrite to replace it, or choose another "
                              f"--output_dir")
    print(f"{path}: replaced (--overwrite)", file=sys.stderr)
    return {}


def main(argv: list[str] | None = None) -> dict:
    """The recipe's entry: a refusal is one line `error: ...` on stderr and exit code 2."""
    with cli.refusals():
        return run(parse_args(argv))


def run(args: EvalArguments) -> dict:
    ref = check_model_and_paths(args)
    out = Path(args.output_dir)
    results_path = out / "results.json"
    config = dataclasses.asdict(args)
    saved = previous_results(results_path, config, args)

    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype, why = loading.resolve_dtype(args.dtype, device)
    print(f"dtype: {str(dtype).removeprefix('torch.')} ({why})")
    model = hp.load_model(ref, dtype=dtype, attn_implementation=args.attn_implementation)
    model = model.to(device).eval()
    tokenizer = hp.load_tokenizer(ref)
    context = model.config.get_text_config().max_position_embeddings
    inputs = prepare_data(args, tokenizer)
    grids = [(f"{spec} @{target}", spec, target) for spec in args.grid for target in args.max_position_embeddings]
    check_lengths(model, args, variant_plan(args) + [(label, point, target) for label, spec, target in grids
                                                       for point in hpe.expand_grid(spec)])

    results = {"config": config, "model": describe(model), "framing": inputs["framing"],
               "grid": saved.get("grid", {}), "variants": saved.get("variants", {})}
    results["dtype"] = {"used": str(dtype).removeprefix("torch."), "why": why}
    results["machine"] = {"date": datetime.date.today().isoformat(), "device": device, "python": platform.python_version(),
                          "torch": torch.__version__, "transformers": transformers.__version__,
                          "platform": platform.platform(), "cpu_threads": torch.get_num_threads()}

    def save():  # the folder appears with the first result, never empty
        out.mkdir(parents=True, exist_ok=True)
        results_path.write_text(json.dumps(results, indent=1, default=str))

    # 1. grids: every point on the tuning documents; the best of each joins the variants (held-out documents)
    plan = variant_plan(args)
    for label, spec, target in grids:
        if label not in results["grid"]:
            results["grid"][label] = search_grid(model, args, inputs, spec, target)
            save()
        best = results["grid"][label]["best"]
        plan.append((f"{best} (grid best)" + (f" @{target}" if len(args.max_position_embeddings) > 1 else ""),
                     best, target))

    # 2. every variant, every measure
    for label, spec, target in plan:
        if label in results["variants"]:
            print(f"{label}: done already (results.json), skipped", file=sys.stderr)
            continue
        print(f"== {label}", file=sys.stderr)
        start = time.perf_counter()
        with hpe.patched(model, spec, target) as params:
            res = {"params": params, "describe": describe(model), **evaluate_variant(model, args, inputs)}
        res.update(seconds=round(time.perf_counter() - start, 1), date=datetime.date.today().isoformat(), device=device)
        results["variants"][label] = res
        save()

    save()
    (out / "summary.md").write_text(report.summary(results, context))
    if args.plots:
        report.figures(results, out, context)
    print((out / "summary.md").read_text())
    return results


if __name__ == "__main__":
    main()
