"""The search recipe's config (recipes/search.py): `model` and `data` (the tuning text) are the recipes' shared
sections (hf_posenc/recipes/recipe_config.py), `search` the space and its budget; `parse_args` reads a YAML file and
`--section.field` flags, and `check_args` the values alone (the model's own limits are checked when it loads:
search.py's `settings`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Union

from hf_posenc.recipes import recipe_config
from hf_posenc.recipes.recipe_config import need


@dataclass
class SearchArgs:
    target: int = field(default=16384, metadata={"help": "the context to extend to (tokens), > the original"})
    mode: str = field(default="switched", metadata={
        "help": "switched: short factors 1 inside the original context, the searched ones past it (transformers "
                "switches by length); static: short = long, one set at every length"})
    budget: int = field(default=24, metadata={"help": "CMA-ES candidates after the 5 seeds (PI, NTK, YaRN, llama3, "
                                                      "the ramp)"})
    passages: int = field(default=24, metadata={"help": "recall passages (all candidates score the same ones)"})
    passage_tokens: int = field(default=192, metadata={"help": "tokens of each passage"})
    far_from: int = field(default=0, metadata={
        "help": "the fitness reads passages at least this far back (0: the original context)"})
    guard_length: int = field(default=2048, metadata={"help": "tokens of the perplexity guard (<= original)"})
    guard_share: float = field(default=0.01, metadata={
        "help": "a candidate whose guard perplexity rises more than this share over the unpatched model's is "
                "rejected before its long pass"})
    top_range: list[float] = field(default_factory=lambda: [0.75, 2.0], metadata={
        "help": "the slowest pair's factor, [low, high] in multiples of target / original"})
    attention_range: list[float] = field(default_factory=lambda: [1.0, 1.3], metadata={
        "help": "the attention factor's [low, high]; [] keeps longrope's default (not searched)"})
    sigma: float = field(default=0.25, metadata={"help": "CMA-ES's first step, in the unit cube of the form"})
    population: int = field(default=0, metadata={"help": "CMA-ES's population (0: its default, 4 + 3 ln dims)"})
    seed: int = field(default=0, metadata={"help": "seed of the passages and of CMA-ES"})
    band_width: int = field(default=0, metadata={
        "help": "spread the passages evenly over distance bands of this width from far_from to the target, every "
                "band weighing alike in the fitness (0: one pool, the passages where the halves put them)"})
    critical_floor: Union[bool, float] = field(default=False, metadata={
        "help": "pairs past the critical one (those that never turned a full period inside the original context) "
                "get a factor of at least s = target / original (true, LongRoPE2), or of this multiple of s "
                "(a number >= 1, at most top_range high)"})
    race: bool = field(default=False, metadata={
        "help": "score each candidate on the first sequence, and the rest only when it is not already clearly "
                "worse than the best (needs >= 2 sequences of passages)"})


@dataclass
class SearchConfig:
    model: recipe_config.ModelArgs = field(default_factory=recipe_config.ModelArgs,
                                           metadata={"help": "the model and how it loads"})
    data: recipe_config.DataArgs = field(default_factory=recipe_config.DataArgs,
                                         metadata={"help": "the tuning text: recall passages and the guard's "
                                                           "tokens (judge on another)"})
    search: SearchArgs = field(default_factory=SearchArgs, metadata={"help": "the search space and its budget"})
    output_dir: str = field(default="runs/search", metadata={
        "help": "search.json, candidates.jsonl, summary.md, convergence.png, best/"})
    save: bool = field(default=True, metadata={"help": "save the best candidate as a checkpoint in output_dir/best"})
    plots: bool = field(default=True, metadata={"help": "draw convergence.png"})


USAGE = "[--config FILE.yaml] [--section.field VALUE ...]"
ABOUT = ("Search RoPE's per-pair rescale factors for a longer context (LongRoPE / LongRoPE2, hf_posenc/search/) and "
         "save the best as a stock `longrope` checkpoint that transformers, vLLM and llama.cpp run, no training.")


def parse_args(argv: list[str] | None = None, prog: str | None = None) -> SearchConfig:
    args = recipe_config.parse(SearchConfig, argv, usage=f"{recipe_config.program('search', prog)} {USAGE}",
                               about=ABOUT, shipped=lambda name: "_search_" in name)
    check_args(args)
    return args


def check_args(args: SearchConfig) -> None:
    """The values alone, before anything loads (the model's own limits: `settings`)."""
    need(bool(args.output_dir.strip()), "output_dir is empty")   # the model and data sections check their own
    s = args.search
    for name in ("top_range", "attention_range"):
        value = getattr(s, name)
        need(len(value) == 2 or (name == "attention_range" and not value),
             f"search.{name} must be [low, high]{' or [] (not searched)' if name == 'attention_range' else ''}, "
             f"got {value}")
