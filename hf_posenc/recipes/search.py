"""Search RoPE's per-pair rescale factors for a longer context (LongRoPE / LongRoPE2, hf_posenc/search/) and
save the best as a stock `longrope` checkpoint that transformers, vLLM and llama.cpp run, no training.

    hf-posenc search --config smollm2_search_16k
    python -m hf_posenc.recipes.search --search.target 16384 --search.budget 24 --output_dir runs/search
    hf-posenc search --help                    # every field, its default and what it does

Each candidate is scored by recall at a distance on a tuning text (the loss of passages repeated from far back),
after a guard on perplexity inside the original context, and appended to output_dir/candidates.jsonl as it
completes: a killed search resumes where it stopped; a rerun with other settings is refused naming each one. At
the end: summary.md, convergence.png (best loss against candidates) and the best candidate saved in
output_dir/best (config.json with `longrope` rope_parameters, the weights, the tokenizer). A configuration that
cannot run is refused before the model loads: one line `error: ...` on stderr, exit code 2."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

from hf_posenc import user_input
from hf_posenc.errors import ConfigError
from hf_posenc.recipes.recipe_config import FRAMINGS
from hf_posenc.recipes.search_config import SearchConfig, parse_args

# torch, transformers and the search load once the config is read: `--help` answers without them.

OUTPUTS = ("search.json", "candidates.jsonl", "summary.md", "convergence.png", "best")   # what it writes in output_dir


def settings(args: SearchConfig, ref: str, original: int, dtype: str):
    """The search's settings (hf_posenc.search.SearchSettings), checked against the model's original context."""
    from hf_posenc.search import SearchSettings

    s = args.search
    try:
        return SearchSettings(model=ref, target=s.target, original=original, mode=s.mode, budget=s.budget,
                              passages=s.passages, passage_tokens=s.passage_tokens, far_from=s.far_from or None,
                              guard_length=s.guard_length, guard_share=s.guard_share, top_range=list(s.top_range),
                              attention_range=list(s.attention_range) or None, sigma=s.sigma,
                              population=s.population, seed=s.seed, corpus=args.data.corpus, dtype=dtype,
                              band_width=s.band_width or None, critical_floor=s.critical_floor, race=s.race)
    except ValueError as err:
        raise ConfigError(f"search: {err}") from None


def original_context(ref: str, config) -> int:
    """The model's context before any patch, from its config (`loading.load_config(ref)`); a model the search cannot
    take is refused."""
    from hf_posenc import _compat
    from hf_posenc.record_reader import read_record

    user_input.model_mechanism(ref, methods=["longrope"])   # a learned table or a bias model: refused here
    text = config.get_text_config()
    record = read_record(config)
    if record is not None:
        raise ConfigError(f"model.name {ref} is already patched ({record.method}): search from the unpatched model")
    rope_type = (getattr(text, "rope_parameters", None) or {}).get("rope_type", "default")
    if rope_type != "default":   # the seeds and candidates rescale plain RoPE (the recipe has no replace_native)
        raise ConfigError(f"model.name {ref} already ships rope_type={rope_type!r} scaling: the factor search rescales "
                          f"plain RoPE from the original context; search from the checkpoint before its scaling")
    if _compat.rope_layer_types(text) != [None]:
        raise ConfigError(f"model.name {ref} has one RoPE per attention type ({_compat.rope_layer_types(text)}): the "
                          f"factor search takes a model with one RoPE for every layer")
    return int(text.max_position_embeddings)


def check_output_dir(out: Path, inputs: list[Path]) -> None:
    """output_dir is new, empty or a search's (a resume goes on in it), and holds no input: the search writes its
    files there and replaces best/ whole, so a folder of something else would be written over."""
    for source in inputs:
        if out in source.resolve().parents:
            raise ConfigError(f"output_dir {out} contains the input {source}, which the search could write over; "
                              f"write somewhere else")
    if not out.is_dir():
        return
    own = {*OUTPUTS, ".lock"}
    foreign = sorted(p.name for p in out.iterdir()
                     if p.name not in own and not any(p.name.startswith(f".{name}.") for name in OUTPUTS))
    orphans = [name for name in OUTPUTS[1:] if (out / name).exists()]   # search.json is written first
    if (foreign or orphans) and not (out / "search.json").is_file():   # beside a search's own, files are kept
        raise ConfigError(f"output_dir {out} holds {user_input.first_names(foreign or orphans)} but no search of its "
                          f"own (search.json): not a search's folder, which the search would write over; choose "
                          f"another --output_dir")


def main(argv: list[str] | None = None, prog: str | None = None) -> dict:
    """The recipe's entry: a refusal is one line `error: ...` and exit code 2; Ctrl-C says what was kept."""
    args = None
    try:
        with user_input.refusals():
            args = parse_args(argv, prog)
            return run(args)
    except KeyboardInterrupt:
        scored = Path(args.output_dir) / "candidates.jsonl" if args is not None else None
        kept = len(scored.read_text().splitlines()) if scored is not None and scored.is_file() else 0
        print(f"\ninterrupted: {kept} finished candidate(s) kept in {scored}; run the same command to go on" if kept
              else "\ninterrupted before the first candidate was scored: nothing was kept", file=sys.stderr)
    raise SystemExit(130)


def run(args: SearchConfig) -> dict:
    """The recipe's phases in order; returns the best candidate."""
    from hf_posenc import search

    recipe = SearchRecipe(args)
    recipe.setup()
    with search.only_search(recipe.out, OUTPUTS):   # one search in the folder, from its first candidate to best/
        best = recipe.run()
        recipe.save(best)
    return best


class SearchRecipe:
    """One factor search of `args`, in the fine-tune recipe's shape: the constructor checks what needs no text and
    no weights (the paths, the model's context, the settings, a saved search to resume), `setup` the text and then
    the model, `run` the search (resumable: candidates.jsonl), `save` the figure, summary.md and the best folder."""

    def __init__(self, args: SearchConfig):
        import torch

        from hf_posenc import loading, search

        self.args = args
        self.ref = user_input.model_ref(args.model.name)
        inputs = [p for p in (Path(self.ref), Path(args.data.corpus)) if p.exists()]
        self.out = user_input.output_folder(args.output_dir, "output_dir", inputs)
        check_output_dir(self.out, inputs)
        config = loading.load_config(self.ref)
        self.original = original_context(self.ref, config)
        args.model.attn_implementation = args.model.attention(config)   # "auto": by the model's class
        self.device = "cuda" if torch.cuda.is_available() else "cpu"
        self.dtype, self.why = loading.resolve_dtype(args.model.dtype, self.device)
        self.settings = settings(args, args.model.name, self.original, str(self.dtype).removeprefix("torch."))
        saved = self.out / "search.json"   # a resume's record checked before the text and the model load
        record = search.resume_record(saved, dataclasses.asdict(self.settings)) if saved.exists() else None
        # a damaged line, or (with the record) a line of another search, refused before the model loads
        search.read_candidates(self.out / "candidates.jsonl", record)

    def setup(self) -> None:
        """The tokenizer and the text, its passages checked (refused before the weights load), then the model and
        the search over it."""
        import hf_posenc as hp
        from hf_posenc import corpora, search

        args, s = self.args, self.settings
        self.tokenizer = tokenizer = hp.load_tokenizer(self.ref)
        prefix = corpora.bos_prefix(tokenizer, FRAMINGS[args.data.framing])
        corpus = args.data.load()
        ids = tokenizer("\n".join(corpus["text"]), add_special_tokens=False)["input_ids"]
        try:
            s.layout(head=len(prefix))
        except ValueError as err:
            raise ConfigError(f"search: {err}") from None
        try:   # the text long enough for its passages: refused before the weights load
            sets = s.recall_sets(tokenizer, ids, prefix)
        except ValueError as err:
            raise ConfigError(f"data.corpus {args.data.corpus!r}: {err}") from None
        if len(ids) + len(prefix) < s.guard_length:
            raise ConfigError(f"data.corpus {args.data.corpus!r} has {len(ids)} tokens, fewer than "
                              f"search.guard_length {s.guard_length}")
        bands = f" in {len(s.bands)} bands of {s.band_width}" if s.band_width else ""
        print(f"dtype: {str(self.dtype).removeprefix('torch.')} ({self.why}); {s.passages} passages at {s.target}, "
              f"far from {s.far}{bands}; {5 + s.budget} candidates{', raced' if s.race else ''}", file=sys.stderr)
        model = hp.load_model(self.ref, dtype=self.dtype, attn_implementation=args.model.attention())
        self.runner = search.FactorSearch(model.to(self.device).eval(), tokenizer, ids, s, self.out, prefix=prefix,
                                          sets=sets)
        print(f"critical pair: {self.runner.critical} of {self.runner.pairs} (pairs from it on never turned a full "
              f"period in {self.original} tokens)"
              f"{'; their factors held >= ' + format(s.floor_factor, 'g') if s.floor_factor else ''}",
              file=sys.stderr)

    def run(self) -> dict:
        """The search: seeds, then CMA-ES, each candidate appended as it completes; the best accepted one."""
        return self.runner.run()

    def save(self, best: dict) -> None:
        """The convergence figure, summary.md, and the best candidate as a stock checkpoint (`save`)."""
        from hf_posenc import search

        args, s, out = self.args, self.settings, self.out
        rows = search.read_candidates(out / "candidates.jsonl", self.runner.record)
        if args.plots:
            search.convergence_figure(rows, out / "convergence.png",
                                      f"{args.model.name}: factor search to {s.target} ({s.mode}), {s.passages} "
                                      f"passages of {args.data.corpus}")
        record = json.loads((out / "search.json").read_text())   # as first written: the unpatched guard's value
        search.write_whole(out / "summary.md", summary(rows, best, s, record))
        if args.save:
            save_best(self.tokenizer, best, s, out / "best", self.ref)
        print(f"best: {best['kind']}, loss {best['loss']:.4f} [{best['low']:.4f}, {best['high']:.4f}] (n {best['n']}); "
              f"{out / 'summary.md'}" + (f"; checkpoint {out / 'best'}" if args.save else ""))


def save_best(tokenizer, best: dict, s, folder: Path, ref: str) -> None:
    """The best candidate as a stock checkpoint: the model as stored (not the search's bfloat16 copy: its weights
    would be rounded), patched with it, saved as `hf-posenc patch` saves."""
    import hf_posenc as hp
    from hf_posenc import search
    from hf_posenc.recipes import patch_card as card

    method, params = search.best_method(best, s.target, s.original)
    model = hp.load_model(ref)
    with hp.patched(model, method, **params), user_input.replacing(folder) as fresh:
        model.save_pretrained(fresh)
        card.fit_tokenizer(tokenizer, model)
        tokenizer.save_pretrained(fresh)
        (Path(fresh) / "README.md").write_text(card.patch_card(model, ref))


def band_lines(best: dict, seed: dict | None = None) -> list[str]:
    """The best candidate's loss band by band, beside the best seed's (a search recorded before bands: nothing): the
    mean of the bands can buy the far ones with the middle ones, and this table shows where."""
    bands = best.get("bands") or []
    if len(bands) < 2:
        return []
    theirs = {(b["from"], b["to"]): b["loss"] for b in (seed.get("bands") or [])} if seed and seed is not best else {}

    def number(x) -> str:
        return "-" if x is None else format(x, ".4f")

    def beside(b: dict) -> str:
        other = theirs.get((b["from"], b["to"]))
        change = "-" if other is None or b["loss"] is None else format(b["loss"] - other, "+.4f")
        return f" {number(other)} | {change} |" if theirs else ""

    extra = f" {seed['kind']} | best - {seed['kind']} |" if theirs else ""
    return [f"| distance band | passages | loss of the repeats |{extra}", "|---|---|---|" + "---|---|" * bool(theirs),
            *(f"| {b['from']}-{b['to']} | {b['n']} | {number(b['loss'])} |{beside(b)}" for b in bands), ""]


def summary(rows: list[dict], best: dict, s, record: dict) -> str:
    """summary.md: the settings, the best candidate, and every candidate in order with its paired difference from
    the best seed (the same passages: the pairing removes how hard each passage is)."""
    from hf_posenc.eval import stats

    def loss(r: dict) -> str:
        if r["rejected"]:
            return f"rejected (guard +{r['guard_rise']:.2%})"
        raced = " raced out after its first sequence" if r.get("raced_out") else ""
        return f"{r['loss']:.4f} [{r['low']:.4f}, {r['high']:.4f}]{raced}"

    seeds = [r for r in rows if r["kind"].startswith("seed:") and not r["rejected"]]
    anchor = min(seeds, key=lambda r: r["value"]) if seeds else None
    cpu_hours = max(1e-9, sum(r.get("cpu_seconds", 0.0) for r in rows) / 3600)
    raced = sum(bool(r.get("raced_out")) for r in rows)

    def versus(r: dict) -> str:
        if r["rejected"] or anchor is None or r is anchor or len(r["losses"]) < 2:
            return ""
        m = min(len(r["losses"]), len(anchor["losses"]))   # a raced-out candidate: its first sequence's passages
        d = stats.paired_difference(r["losses"][:m], anchor["losses"][:m])
        return f"{d['mean']:+.3f} [{d['low']:+.3f}, {d['high']:+.3f}]"

    lines = [f"# Factor search: {s.model} to {s.target} tokens ({s.mode})", "",
             f"Fitness: mean loss of the repeats of passages at least {s.far} tokens back"
             + (f", every band of {s.band_width} tokens weighing alike" if s.band_width else "") + f" (n {best['n']} of "
             f"{s.passages}, {s.passage_tokens}-token passages of {s.corpus}; nats / token, lower is better; the same "
             f"passages for every candidate). Guard: perplexity of the first {s.guard_length} tokens, unpatched "
             f"{record.get('unpatched_guard_perplexity', float('nan')):.4f}, at most +{s.guard_share:.1%}. dtype "
             f"{s.dtype}.", "",
             f"**Best: {best['kind']}**, loss {loss(best)}, attention factor {best['attention_factor']}, "
             f"guard {best['guard_perplexity']:.4f} ({best['guard_rise']:+.2%})"
             + (f"; against the best seed ({anchor['kind']}), paired: {versus(best)}" if versus(best) else "") + ".",
             "", f"long_factor: {json.dumps(best['long_factor'])}", "",
             f"Critical pair: {record.get('critical_pair', '?')} of {len(best['long_factor'])} (the pairs from it on "
             f"never turned a full period inside the original {s.original} tokens; LongRoPE2's critical dimension)"
             + (f"; their factors held >= {s.floor_factor:g}." if s.floor_factor else ".")
             + f" Cost: {cpu_hours:.2f} CPU-hours, {len(rows) / cpu_hours:.1f} candidates a CPU-hour"
             + (f" ({raced} raced out after their first sequence)" if s.race else "") + ".", "",
             *band_lines(best, anchor),
             f"| # | candidate | loss of far repeats (95 %) | - {anchor['kind'] if anchor else 'best seed'} (paired, 95 %) "
             f"| one-pass gap | guard | seconds |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        gap = "" if r["rejected"] else f"{r['gap_one_pass']:.3f}"
        lines.append(f"| {r['index']} | {r['kind']} | {loss(r)} | {versus(r)} | {gap} | {r['guard_rise']:+.2%} | "
                     f"{r['seconds']} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
