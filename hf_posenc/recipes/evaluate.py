"""Evaluate positional variants of one model: perplexity against context length, by position and with a
sliding window, passkey and needle retrieval, recall at a distance, RULER's retrieval families, and parameter
grids tuned on some documents and checked on others. Writes results.json (after every cell: a rerun resumes),
summary.md and figures to output_dir.

    python recipes/evaluate.py --config recipes/configs/eval_smollm2.yaml
    python recipes/evaluate.py --config eval_smollm2 --eval.variants none yarn --eval.curve_length 4096
    python recipes/evaluate.py --help                     # every field, its default and what it does

The config has sections model, data and eval (and output_dir, resume, overwrite, plots): every field is
a key of its section in the YAML file and a flag --section.field (the flag wins), read by the recipes'
one config system (hf_posenc/recipes/recipe_config.py). Variants are "none" (the model as loaded) or a method
with parameters ("yarn", "yarn beta_fast=16"); each runs at every target in eval.max_position_embeddings
(several targets make a sweep). Documents and prompts start as
the tokenizer starts an input (framing: BOS first for Llama, Gemma, Mistral), recorded in results.json.
A configuration that cannot run is refused before anything is written (most of it before the model
loads): one line `error: ...` on stderr, exit code 2."""

from __future__ import annotations

import dataclasses
import datetime
import json
import math
import platform
import sys
import time
from pathlib import Path

import hf_posenc as hp
from hf_posenc import user_input
from hf_posenc.errors import ConfigError
from hf_posenc.recipes import recipe_config
from hf_posenc.recipes.evaluate_config import (OUTPUT_ONLY, EvalConfig, check_model_and_paths, max_length, parse_args,
                                               recall_plan, variant_runs)
from hf_posenc.recipes.recipe_config import FRAMINGS

# torch, transformers and the measures (hf_posenc.eval) load inside the functions that use them, once the
# config is read: `--help` answers without them (tests/test_help_speed.py).


def prepare_data(args: EvalConfig, tokenizer) -> dict:
    """Token ids for each measure, the haystack text, the retrieval trials. With a grid, the first
    tune_documents long enough are the tuning split, and the other perplexity measures read only the
    documents after them (held out). Each document and prompt starts as `framing` says (by default as the
    tokenizer starts an input); the sliding window puts that BOS before every window instead."""
    from hf_posenc import corpora
    from hf_posenc import eval as hpe

    corpus = args.data.load()
    bos = FRAMINGS[args.data.framing]
    prefix = corpora.bos_prefix(tokenizer, bos)
    tokenized = corpora.tokenize(corpus, tokenizer, bos=bos)
    names = corpus["title"] if "title" in corpus.column_names else [f"#{i}" for i in range(len(corpus))]
    docs = list(zip(names, tokenized["input_ids"]))
    out = {"tune": [], "lengths": [], "curve": [], "strided": [], "trials": {},
           "framing": "bos" if prefix else "none", "bos": prefix[0] if prefix else None}
    ev, spec = args.eval, args.data.corpus
    if ev.grid:
        length = ev.tune_length or max(ev.perplexity_lengths)
        out["tune"], docs = take(docs, length, ev.tune_documents, "eval.tune_documents", spec)
    if ev.perplexity_lengths:
        out["lengths"], _ = take(docs, max(ev.perplexity_lengths), ev.perplexity_documents,
                                 "eval.perplexity_documents", spec)
    if ev.curve_length:
        out["curve"], _ = take(docs, ev.curve_length, ev.curve_documents, "eval.curve_documents", spec)
    if ev.strided_windows:
        eos = [] if tokenizer.eos_token_id is None else [tokenizer.eos_token_id]
        stream = [t for _, ids in docs for t in ids[len(prefix):] + eos]
        out["strided"] = stream[:ev.strided_tokens]
        stride, window = ev.strided_stride, min(ev.strided_windows)
        if prefix and stride >= window:
            raise ConfigError(f"eval.strided_stride={stride}: with the BOS before every window, a window of "
                              f"{window} holds {window - 1} tokens of text; use a stride of at most {window - 1}")
    if ev.recall_lengths:
        out["recall"] = recall_sets(args, tokenizer, corpus, prefix)
    if ev.tasks:
        from hf_posenc.eval import ruler

        hay = "\n".join(corpus["text"])[:16 * max(ev.task_lengths)]
        try:
            out["tasks"] = {task: ruler.make_samples(task, tokenizer, lengths=ev.task_lengths,
                                                     samples=ev.task_samples, depths=ev.depths,
                                                     needles=ev.task_needles, hops=ev.task_hops, haystack=hay,
                                                     seed=ev.seed, bos=bos) for task in ev.tasks}
        except ValueError as err:
            raise ConfigError(f"eval.tasks at eval.task_lengths {ev.task_lengths}: {err}") from None
    for task, lengths in (("passkey", ev.passkey_lengths), ("needle", ev.needle_lengths)):
        if lengths:  # the needle hides in the corpus text: enough of it for the longest prompt
            haystack = "\n".join(corpus["text"])[:16 * max(lengths)] if task == "needle" else None
            try:
                out["trials"][task] = hpe.make_trials(task, tokenizer, lengths=lengths, depths=ev.depths,
                                                      trials=ev.trials, haystack=haystack, seed=ev.seed, bos=bos)
            except ValueError as err:
                raise ConfigError(f"eval.{task}_lengths {lengths}: {err}") from None
    return out


def recall_sets(args: EvalConfig, tokenizer, corpus, prefix: list[int]) -> dict:
    """The recall sequences of each length, from eval.recall_corpus (default: the corpus read)."""
    from hf_posenc import corpora
    from hf_posenc.eval import recall

    ev = args.eval
    text_corpus = corpora.load_corpus(ev.recall_corpus) if ev.recall_corpus else corpus
    ids = tokenizer("\n".join(text_corpus["text"]), add_special_tokens=False)["input_ids"]
    out = {}
    for length in ev.recall_lengths:
        per_sequence, sequences = recall_plan(ev, length)
        layout = recall.plan_layout(length, passages=per_sequence, passage_tokens=ev.recall_passage_tokens,
                                    distances=ev.recall_distances or None, head=len(prefix), seed=ev.seed)
        try:
            out[length] = recall.make_recall(tokenizer, ids, layout, sequences=sequences, seed=ev.seed,
                                             prefix=prefix)
        except ValueError as err:
            raise ConfigError(f"eval.recall_lengths {length} (eval.recall_corpus "
                              f"{ev.recall_corpus or args.data.corpus!r}): {err}") from None
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
        raise ConfigError(f"corpus {corpus!r}: {field_name}={count} needs {count} documents of >= {length} "
                          f"tokens, {len(chosen)} have them; too short (tokens): {listed or 'no documents'}. Use "
                          f"a shorter length, fewer documents, or a corpus with longer ones")
    return chosen, docs[last + 1:]


def describe(model) -> dict:
    """hp.describe, or just the model type for a model hf_posenc cannot patch (it can still run "none")."""
    try:
        return hp.describe(model)
    except hp.PosEncError as err:
        return {"model_type": model.config.model_type, "note": str(err)}


def evaluate_variant(model, args: EvalConfig, inputs: dict, cells: dict | None = None, keep=None) -> dict:
    """Every measure of one variant, and the seconds each took ("seconds_by_measure"). The recall and task
    cells are long: each one done is handed to `keep(name, cell)` (saved at once), and one already in `cells`
    (an interrupted run's) is taken as it is."""
    from hf_posenc import eval as hpe
    from hf_posenc.eval import recall, ruler

    res, seconds = {}, {}
    cells = {} if cells is None else cells

    def timed(name, fn):
        start = time.perf_counter()
        value = fn()
        seconds[name] = round(time.perf_counter() - start, 1)
        return value

    ev = args.eval
    if inputs["lengths"]:
        res["lengths"] = timed("lengths", lambda: hpe.perplexity_by_length(model, inputs["lengths"],
                                                                           ev.perplexity_lengths))
    if inputs["curve"]:
        res["curve"] = timed("curve", lambda: hpe.perplexity_curve(model, inputs["curve"], length=ev.curve_length,
                                                                   bucket=ev.curve_bucket))
    for window in ev.strided_windows:
        res.setdefault("strided", {})[str(window)] = timed(f"strided {window}", lambda: hpe.strided_perplexity(
            model, inputs["strided"], window=window, stride=ev.strided_stride or window // 2, bos=inputs["bos"]))
    for task, trials in inputs["trials"].items():
        res[task] = timed(task, lambda: hpe.summarize(trials, hpe.score_trials(model, trials)))

    def cell(name: str, fn) -> dict:
        if name not in cells:
            cells[name] = timed(name, fn)
            if keep is not None:
                keep(name, cells[name])
        return cells[name]

    for length, sets in inputs.get("recall", {}).items():
        res.setdefault("recall", {})[str(length)] = cell(f"recall {length}", lambda: recall.summarize_recall(
            recall.score_recall(model, sets, control=ev.recall_control), length=length,
            bin_width=ev.recall_bin or None, seed=ev.seed))
    for task, samples in inputs.get("tasks", {}).items():
        rows = []
        for length in ev.task_lengths:
            mine = [s for s in samples if s.length == length]
            rows += cell(f"{task} {length}", lambda: ruler.score_samples(model, mine))
        res.setdefault("tasks", {})[task] = {**ruler.summarize_samples(rows)[task], "rows": rows}
    res["seconds_by_measure"] = seconds
    return res


def search_grid(model, args: EvalConfig, inputs: dict, spec: str, target: int) -> dict:
    """Every point of one grid scored on the tuning documents (perplexity at tune_length); the best
    named as the hp.patch call that makes it."""
    from tqdm.auto import tqdm

    from hf_posenc import eval as hpe

    length = args.eval.tune_length or max(args.eval.perplexity_lengths)
    points = []
    for point in tqdm(hpe.expand_grid(spec), desc=f"grid {spec} @{target}", unit="point"):
        with hpe.variant(model, point, target) as params:
            ppl = hpe.perplexity_by_length(model, inputs["tune"], [length], progress=False)["perplexity"][0]
        points.append({"variant": point, "params": params, "perplexity": ppl})
    best = min(points, key=lambda p: p["perplexity"])
    method = best["variant"].split()[0]
    call = ", ".join([f"{method!r}", *(f"{k}={v!r}" for k, v in best["params"].items())])
    return {"length": length, "documents": len(inputs["tune"]), "target": target, "points": points,
            "best": best["variant"], "patch": f"hp.patch(model, {call})"}


def passes(args: EvalConfig, inputs: dict, done=()) -> list[int]:
    """The length of every forward pass one variant's measures make (for the estimate of the run's time), less
    those of the recall and task cells in `done` (an interrupted run's, which a rerun takes as they are)."""
    ev, out = args.eval, []
    if inputs["lengths"]:   # one pass per document gives every length (a pass per length when it cannot)
        out += [max(ev.perplexity_lengths)] * len(inputs["lengths"])
    out += [ev.curve_length] * len(inputs["curve"])
    for window in ev.strided_windows:
        stride = ev.strided_stride or window // 2
        out += [window] * (max(0, -(-(len(inputs["strided"]) - window) // stride)) + 1)
    for task, trials in inputs["trials"].items():
        lengths = ev.passkey_lengths if task == "passkey" else ev.needle_lengths
        out += [n for n in lengths for _ in range(len(trials) // len(lengths))]
    for length, sets in inputs.get("recall", {}).items():
        if f"recall {length}" not in done:
            out += [length] * len(sets) * (2 if ev.recall_control else 1)
    for task, samples in inputs.get("tasks", {}).items():   # one prefill a sample where it is shared
        out += [s.length for s in samples if f"{task} {s.length}" not in done]
    return out


def seconds_per_token(model, lengths: tuple[int, int]) -> tuple[float, float]:
    """(a, b): a pass of n tokens takes about n * (a + b * n) seconds, from one timed forward at each of two
    lengths (the attention's share grows with n)."""
    import torch

    device = next(model.parameters()).device
    vocab = model.config.get_text_config().vocab_size
    per_token = []
    for n in lengths:
        ids = (torch.arange(n, device=device)[None] * 7 + 3) % vocab
        with torch.no_grad():
            start = time.perf_counter()
            model(input_ids=ids, use_cache=False)
            per_token.append((time.perf_counter() - start) / n)
    (n1, n2), (t1, t2) = lengths, per_token
    b = max(0.0, (t2 - t1) / (n2 - n1)) if n2 != n1 else 0.0
    return max(t1 - b * n1, 0.0), b


def estimate_line(model, args: EvalConfig, inputs: dict, results: dict, runs: list, grids: list) -> str:
    """What is left to do (a rerun skips what results.json holds: evaluations, grids, recall and task cells)
    and about how long it takes, from two timed forwards of this model here."""
    from hf_posenc import eval as hpe
    from hf_posenc.recipes.finetune_recipe import duration

    done, partial = results["variants"], results["partial"]
    left = [passes(args, inputs, partial.get(label, {})) for label, *_ in runs if label not in done]
    for label, spec, target in grids:   # each grid's best point is then evaluated as a variant
        best = results["grid"].get(label, {}).get("best")
        run_label = None if best is None else grid_best_label(best, target, args)
        if run_label not in done:
            left.append(passes(args, inputs, partial.get(run_label, {})))
    points = sum(len(hpe.expand_grid(spec)) for label, spec, _ in grids if label not in results["grid"])
    saved = [f"{n} {what}" for n, what in ((len(done), "evaluation(s)"), (len(results["grid"]), "grid(s)"),
                                           (sum(map(len, partial.values())), "recall / task cell(s)")) if n]
    already = f"; done already (results.json): {', '.join(saved)}" if saved else ""
    lengths = [n for one in left for n in one]
    if not lengths and not points:
        return f"to do: nothing left{already}"
    tune = args.eval.tune_length or max(args.eval.perplexity_lengths, default=0)
    longest = max(lengths + [tune if points else 0, 2])
    probe = (min(256, longest), min(1024, longest))
    _, spec, target = runs[0]
    with hpe.variant(model, spec, target):   # takes every length asked (check_lengths); a table as loaded may not
        a, b = seconds_per_token(model, probe)
    seconds = sum(n * (a + b * n) for n in lengths)
    seconds += points * len(inputs["tune"]) * tune * (a + b * tune)
    each = {len(one) for one in left}
    count = (f"{len(left)} evaluation(s) x {len(left[0])} forward passes" if len(each) == 1
             else f"{len(left)} evaluation(s), {len(lengths)} forward passes in all")
    return (f"to do: {count} of up to {longest} tokens" + (f", {points} grid point(s)" if points else "")
            + f"; roughly {duration(seconds)} here (from timed passes of {probe[0]} and {probe[1]} tokens)"
            + already)


def grid_best_label(best: str, target: int, args: EvalConfig) -> str:
    """The label a grid's best point is evaluated under."""
    return f"{best} (grid best)" + (f" @{target}" if len(args.eval.max_position_embeddings) > 1 else "")


def check_lengths(model, args: EvalConfig, runs: list[tuple[str, str, int]]) -> None:
    """Every variant takes the longest input asked of it (a learned table may not): refused before any
    measure runs."""
    from hf_posenc import eval as hpe

    longest = max_length(args)
    for label, spec, target in runs:
        with hpe.variant(model, spec, target):
            try:
                hp.check_length(model, longest)
            except hp.SequenceTooLongError as err:
                raise ConfigError(f"variant {label!r} cannot take the {longest} tokens this configuration "
                                  f"asks for: {err}") from None


def previous_results(path: Path, config: dict, args: EvalConfig) -> dict:
    """What results.json holds of this configuration (to resume from); a file of another configuration
    is only replaced with --overwrite (checked before anything is loaded), and the refusal names each setting
    that differs with both values."""
    if not path.exists():
        return {}
    try:
        saved = json.loads(path.read_text())
    except ValueError as err:
        saved = err
    if not isinstance(saved, dict):
        raise ConfigError(f"{path} is not a results file of this recipe ({saved}); remove it or choose "
                          f"another --output_dir")
    changes = config_changes(saved.get("config"), config)
    if args.resume and not changes:
        return restore_not_finite(saved, path)
    if not args.overwrite:
        if changes:
            listed = ", ".join(f"{key} {recipe_config.shown_setting(old)} -> {recipe_config.shown_setting(new)}"
                               for key, old, new in changes)
            raise ConfigError(f"{path} already holds another configuration: {listed} (saved -> this command); "
                              f"rerun with the saved values to resume, pass --overwrite to replace it, or choose "
                              f"another --output_dir")
        raise ConfigError(f"{path} already holds results (resume is off): pass --overwrite to replace it, or "
                          f"choose another --output_dir")
    print(f"{path}: replaced (--overwrite)", file=sys.stderr)
    return {}


def config_changes(saved, config: dict) -> list[tuple[str, object, object]]:
    """(key, saved value, new value) of each setting that changes what is measured: the output fields aside, a
    field a saved config lacks (added since) taken at its default, and the eval fields no measure asked for on
    either side reads (eval.task_needles without a family that hides several needles) left out."""
    saved = saved if isinstance(saved, dict) else {}
    defaults = dataclasses.asdict(EvalConfig())

    def settings(c: dict) -> dict:
        out = {}
        for key, default in defaults.items():
            if key not in OUTPUT_ONLY:
                value = c.get(key, default)
                out[key] = {**default, **value} if isinstance(default, dict) and isinstance(value, dict) else value
        return out

    old, new = settings(saved), settings(config)
    for key in unread(old.get("eval")) & unread(new["eval"]):
        del old["eval"][key], new["eval"][key]
    return recipe_config.differences("", recipe_config.plain(old), recipe_config.plain(new))


RECALL_FIELDS = ("recall_passages", "recall_passage_tokens", "recall_distances", "recall_corpus", "recall_control",
                 "recall_bin")


def reading(tasks, setting: str) -> set[str]:
    """The families among `tasks` that read make_samples' `setting` (depths, needles, hops: each family says which,
    hf_posenc/eval/ruler.py)."""
    from hf_posenc.eval import ruler

    return {t for t in tasks if t in ruler.TASKS and setting in ruler.TASKS[t].reads}


def unread(ev) -> set[str]:
    """The eval fields no measure of `ev` (an eval section as results.json holds it) reads: their values
    change nothing. A section that is not one (a file edited by hand) has none."""
    try:
        tasks, trials = set(ev["tasks"]), ev["passkey_lengths"] or ev["needle_lengths"]
        reads = {"perplexity_documents": ev["perplexity_lengths"], "tune_documents": ev["grid"],
                 "tune_length": ev["grid"], "curve_documents": ev["curve_length"],
                 "curve_bucket": ev["curve_length"], "strided_stride": ev["strided_windows"],
                 "strided_tokens": ev["strided_windows"], "trials": trials,
                 "depths": trials or reading(tasks, "depths"),
                 "seed": trials or ev["recall_lengths"] or tasks, "task_samples": tasks,
                 "task_needles": reading(tasks, "needles"), "task_hops": reading(tasks, "hops"),
                 **{name: ev["recall_lengths"] for name in RECALL_FIELDS}}
    except (TypeError, KeyError):
        return set()
    return {name for name, read in reads.items() if not read}


def strict_json(results: dict) -> str:
    """results.json's text: strict JSON (no bare NaN), each NaN or infinite number written as null and listed,
    with its key path and value, under "not_finite" with a note, so that a rerun reads it back as it was."""
    found = []

    def clean(value, where: list):
        if isinstance(value, float) and not math.isfinite(value):
            found.append([where, str(value)])   # 'nan', 'inf' or '-inf'
            return None
        if isinstance(value, dict):
            return {k: clean(v, [*where, str(k)]) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [clean(v, [*where, i]) for i, v in enumerate(value)]
        return value

    out = clean({k: v for k, v in results.items() if k != "not_finite"}, [])
    if found:
        out["not_finite"] = {"note": "JSON has no NaN or infinity: these values are written as null; each is "
                                     "listed here with its key path and value", "values": found}
    return json.dumps(out, indent=1, default=str, allow_nan=False)


def restore_not_finite(saved: dict, path: Path) -> dict:
    """`saved` with the numbers strict_json wrote as null put back (NaN, inf)."""
    note = saved.pop("not_finite", None) or {}
    for entry in note.get("values", []) if isinstance(note, dict) else [note]:
        try:
            where, value = entry
            node = saved
            for key in where[:-1]:
                node = node[key]
            if node[where[-1]] is not None:
                raise ValueError("not null")
            node[where[-1]] = float(value)
        except (KeyError, IndexError, TypeError, ValueError):
            raise ConfigError(f"{path}: its not_finite list names {entry!r}, which holds no null there; the file "
                              f"was edited: remove it or choose another --output_dir") from None
    return saved


class Interrupted(Exception):
    """Ctrl-C: the message says what results.json holds and how to continue."""


def main(argv: list[str] | None = None, prog: str | None = None) -> dict:
    """The recipe's entry: a refusal is one line `error: ...` on stderr and exit code 2; Ctrl-C one line
    saying what was saved and how to continue, exit code 130. `prog`: the command `usage:` names (default:
    as this process started)."""
    try:
        with user_input.refusals():
            return run(parse_args(argv, prog))
    except KeyboardInterrupt:
        print("\ninterrupted before the first evaluation: nothing was saved", file=sys.stderr)
    except Interrupted as stop:
        print(f"\n{stop}", file=sys.stderr)
    raise SystemExit(130)


def run(args: EvalConfig) -> dict:
    """The recipe's phases in order; returns the results (as results.json holds them)."""
    recipe = EvaluateRecipe(args)
    recipe.setup()
    recipe.run()
    return recipe.save()


class EvaluateRecipe:
    """One evaluation of `args`, in the fine-tune recipe's shape: the constructor checks the model and the paths
    and reads what a previous run saved (resume), `setup` loads the model and builds every input, `run` evaluates
    the grids and the variants (results.json written after each), `save` writes summary.md and the figures."""

    def __init__(self, args: EvalConfig):
        from hf_posenc import loading

        self.args = args
        self.ref = check_model_and_paths(args)
        # "auto": sdpa, or eager where the model's class has none; resolved before the config is compared and saved
        args.model.attn_implementation = args.model.attention(loading.load_config(self.ref))
        self.out = Path(args.output_dir)
        self.results_path = self.out / "results.json"
        self.config = dataclasses.asdict(args)
        self.saved = previous_results(self.results_path, self.config, args)

    def setup(self) -> None:
        """The model on its device in the resolved dtype, the lengths checked against it (before the inputs are
        built), the tokenizer, every input, and the results so far."""
        import torch
        import transformers

        from hf_posenc import eval as hpe
        from hf_posenc import loading

        args, saved = self.args, self.saved
        self.device = device = "cuda" if torch.cuda.is_available() else "cpu"
        dtype, why = loading.resolve_dtype(args.model.dtype, device)
        print(f"dtype: {str(dtype).removeprefix('torch.')} ({why})")
        model = hp.load_model(self.ref, dtype=dtype, attn_implementation=args.model.attention())
        self.model = model = model.to(device).eval()
        targets = args.eval.max_position_embeddings
        self.grids = [(f"{spec} @{target}", spec, target) for spec in args.eval.grid for target in targets]
        # before the inputs are built: a length past a table would otherwise be found out after them
        check_lengths(model, args, variant_runs(args) + [(label, point, target) for label, spec, target in self.grids
                                                           for point in hpe.expand_grid(spec)])
        tokenizer = hp.load_tokenizer(self.ref)
        self.context = model.config.get_text_config().max_position_embeddings
        self.inputs = prepare_data(args, tokenizer)
        self.results = {"config": self.config, "model": describe(model), "framing": self.inputs["framing"],
                        "grid": saved.get("grid", {}), "variants": saved.get("variants", {}),
                        "partial": saved.get("partial", {})}
        self.results["dtype"] = {"used": str(dtype).removeprefix("torch."), "why": why}
        self.results["machine"] = {"date": datetime.date.today().isoformat(), "device": device,
                                   "python": platform.python_version(), "torch": torch.__version__,
                                   "transformers": transformers.__version__, "platform": platform.platform(),
                                   "cpu_threads": torch.get_num_threads()}

    def _write(self) -> None:   # the folder appears with the first result, never empty
        self.out.mkdir(parents=True, exist_ok=True)
        self.results_path.write_text(strict_json(self.results))

    def run(self) -> None:
        """The grids, then every variant, each saved as it finishes; Ctrl-C says what was saved (Interrupted)."""
        results, runs = self.results, variant_runs(self.args)
        print(estimate_line(self.model, self.args, self.inputs, results, runs, self.grids), file=sys.stderr)
        try:
            evaluate_all(self.model, self.args, self.inputs, results, runs, self.grids, self._write, self.device)
        except KeyboardInterrupt:
            done = [*results["variants"], *(f"grid {label}" for label in results["grid"]),
                    *(f"{label}: {cell}" for label, cells in results["partial"].items() for cell in cells)]
            raise Interrupted(
                f"interrupted: {self.results_path} holds {len(done)} finished evaluation(s) ({', '.join(done)}); run "
                f"the same command again to do the rest (resume: true skips what is saved)" if done else
                "interrupted during the first evaluation: nothing was saved") from None

    def save(self) -> dict:
        """results.json, summary.md and the figures; the summary printed. Returns the results."""
        from hf_posenc.eval import report

        self._write()
        out = self.out
        (out / "summary.md").write_text(report.summary(self.results, self.context))
        drawn = report.figures(self.results, out, self.context) if self.args.plots else []
        print((out / "summary.md").read_text())
        print(report.written_line(out, drawn))
        return self.results


def evaluate_all(model, args: EvalConfig, inputs: dict, results: dict, runs: list, grids: list, save,
                 device: str) -> None:
    """The grids (the best point of each joins `runs`), then every variant; results saved after each. A
    pass of at least half the longest input shows a bar over the model's layers."""
    from hf_posenc import eval as hpe
    from hf_posenc.eval.perplexity import pass_progress

    long_pass = max(512, max_length(args) // 2)
    # 1. grids: every point on the tuning documents; the best of each joins the variants (held-out documents)
    for label, spec, target in grids:
        if label not in results["grid"]:
            results["grid"][label] = search_grid(model, args, inputs, spec, target)
            save()
        best = results["grid"][label]["best"]
        runs.append((grid_best_label(best, target, args), best, target))

    # 2. every variant, every measure
    for label, spec, target in runs:
        if label in results["variants"]:
            print(f"{label}: done already (results.json), skipped", file=sys.stderr)
            continue
        print(f"== {label}", file=sys.stderr)
        start = time.perf_counter()
        partial = results.setdefault("partial", {}).setdefault(label, {})

        def keep(name: str, cell) -> None:   # a finished recall / task cell survives an interrupted run
            partial[name] = cell
            save()

        with hpe.variant(model, spec, target) as params, pass_progress(model, label, min_tokens=long_pass):
            res = {"params": params, "describe": describe(model),
                   **evaluate_variant(model, args, inputs, cells=partial, keep=keep)}
        res.update(seconds=round(time.perf_counter() - start, 1), date=datetime.date.today().isoformat(), device=device)
        results["variants"][label] = res
        results["partial"].pop(label, None)
        save()


if __name__ == "__main__":
    main()
