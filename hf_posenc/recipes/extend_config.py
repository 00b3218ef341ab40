"""The extend recipe's config (recipes/extend.py): `--model` and `--target`, the budget (`--tokens` or `--hours`),
and one section a stage (search, train, judge) whose fields default to null: the plan's rule
(hf_posenc/recipes/extend.py, `make_plan`) sets each from the model, the target and the machine, and a value given
here wins. `parse_args` reads them through the recipes' one config system (hf_posenc/recipes/recipe_config.py) and
checks the values alone."""

from __future__ import annotations

import math
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

from hf_posenc.recipes import recipe_config
from hf_posenc.recipes.recipe_config import need

JUDGE_MODES = ("full", "quick", "skip")


@dataclass
class SearchPlanArgs:
    corpus: str = field(default="shakespeare", metadata={"help": "the search's tuning text (a load_corpus spec)"})
    candidates: int | None = field(default=None, metadata={
        "help": "CMA-ES candidates after the 5 seeds (null: 16, fewer where --hours leaves no time for them)"})
    critical_floor: float | None = field(default=None, metadata={
        "help": "the critical pairs' least factor in multiples of s (null: 1.33, their farthest position at the "
                "target lands at 3/4 of the original context)"})
    far_from: int | None = field(default=None, metadata={
        "help": "the fitness reads passages at least this far back (null: half the original context)"})
    band_width: int | None = field(default=None, metadata={
        "help": "distance bands the fitness weighs alike (null: about target / 8, the span past far_from split "
                "evenly; wider where the passages are few)"})
    passages: int | None = field(default=None, metadata={
        "help": "recall passages over 2 sequences (null: what fills 56 % of them, as the shipped search)"})
    passage_tokens: int | None = field(default=None, metadata={
        "help": "tokens of a passage (null: 192, less for a short original context)"})
    guard_share: float | None = field(default=None, metadata={
        "help": "largest rise of perplexity inside the original context a candidate may have (null: 0.08 up to "
                "4x the original context, 0.02 x s past it)"})


@dataclass
class TrainPlanArgs:
    corpus: str = field(default="stdlib", metadata={"help": "the fine-tune's text (long documents)"})
    seq_len: int | None = field(default=None, metadata={
        "help": "tokens of a training window (null: half the original context)"})
    lr: float = field(default=6e-5, metadata={
        "help": "AdamW learning rate (constant after min(10, steps / 5) warmup steps)"})
    longce_window: int | None = field(default=None, metadata={
        "help": "LongCE's short window (null: 1/16 of the original context)"})
    seed: int = field(default=42, metadata={"help": "seed of the data order"})
    short_steps: int | None = field(default=None, metadata={
        "help": "steps of the short stage after the fine-tune: contiguous windows inside the original context, "
                "cross-entropy (null: a quarter of the fine-tune's steps; 0: no short stage)"})
    short_lr: float | None = field(default=None, metadata={"help": "the short stage's learning rate (null: lr / 2)"})
    short_long_share: float | None = field(default=None, metadata={
        "help": "share of the short stage's windows drawn as the fine-tune's long ones (PoSE ids over the target), "
                "window by window (null: the rule; 0: contiguous windows alone)"})


@dataclass
class JudgePlanArgs:
    mode: str = field(default="full", metadata={
        "help": "full (recall over two passage seeds, perplexity, passkey), quick (one seed, no passkey), skip"})
    corpus: str | None = field(default=None, metadata={
        "help": "the held-out text (null: the first of kjv, shakespeare, stdlib that no stage reads)"})
    passages: int | None = field(default=None, metadata={
        "help": "recall passages a seed (null: 48 per 32k of target)"})
    bin: int | None = field(default=None, metadata={
        "help": "width of the distance bins (null: the larger of half the original context and target / 8)"})


@dataclass
class ExtendConfig:
    model: recipe_config.ModelArgs = field(default_factory=recipe_config.ModelArgs,
                                           metadata={"help": "the checkpoint to extend (--model NAME for short)"})
    target: int = field(default=0, metadata={"help": "the context to extend to (tokens), > the original"})
    tokens: int = field(default=0, metadata={
        "help": "the fine-tune's training tokens (0: 9.375 x target, the shipped 307k at 32k; or from --hours)"})
    hours: float = field(default=0.0, metadata={
        "help": "wall time for the search, the fine-tune and the short stage on this machine (0: --tokens' "
                "rule): the fine-tune and its short stage share what the search leaves, at this machine's "
                "measured rate; the judge comes on top (the plan says its minutes; --judge.mode quick or skip "
                "cuts it)"})
    search: SearchPlanArgs = field(default_factory=SearchPlanArgs, metadata={"help": "the factor search"})
    train: TrainPlanArgs = field(default_factory=TrainPlanArgs, metadata={"help": "the fine-tune"})
    judge: JudgePlanArgs = field(default_factory=JudgePlanArgs, metadata={"help": "the report card"})
    output_dir: str = field(default="", metadata={"help": "the run's folder (empty: runs/extend_NAME_TARGET)"})
    plan_only: bool = field(default=False, metadata={"help": "print the plan and stop"})


USAGE = "--model NAME --target TOKENS [--hours H | --tokens N] [--section.field VALUE ...]"
ABOUT = ("Extend a RoPE checkpoint's context in one command: plan, factor search, fine-tune, short stage, judge, "
         "export.")


def parse_args(argv: list[str] | None = None, prog: str | None = None) -> ExtendConfig:
    argv = ["--model.name" if a == "--model" else "--model.name=" + a[8:] if a.startswith("--model=") else a
            for a in (sys.argv[1:] if argv is None else argv)]
    args = recipe_config.parse(ExtendConfig, argv, usage=f"{recipe_config.program('extend', prog)} {USAGE}",
                               about=ABOUT, shipped=lambda name: name.startswith("extend_"))
    from hf_posenc.eval.retrieval import MAX_LENGTH
    from hf_posenc.search.record import MAX_BUDGET, MIN_PASSAGES

    world = os.environ.get("WORLD_SIZE", "1")
    need(not world.isdigit() or int(world) <= 1, f"hf-posenc extend runs in one process (WORLD_SIZE is {world}): its "
                                                 f"stages would all run once a process; start it without torchrun or "
                                                 f"accelerate launch")
    need(args.target > 0, f"--target is needed, a positive number of tokens: the context to extend to (e.g. --target "
                          f"32768){'' if args.target == 0 else f', got {args.target}'}")
    need(args.target <= MAX_LENGTH, f"--target {args.target} is past the longest context the search and the judge lay "
                                    f"out ({MAX_LENGTH} tokens)")
    for name in ("far_from", "band_width", "passage_tokens"):   # the search reads 0 as its default for the first two
        value = getattr(args.search, name)
        need(value is None or value >= 1, f"search.{name} must be >= 1 token (or null: the rule), got {value}")
    for name, least, most in (("passages", MIN_PASSAGES, None), ("candidates", 0, MAX_BUDGET)):
        value = getattr(args.search, name)
        need(value is None or value >= least, f"search.{name} must be >= {least} (or null: the rule), got {value}")
        need(value is None or most is None or value <= most, f"search.{name} must be <= {most}, got {value}")
    for name in ("passages", "bin"):
        value = getattr(args.judge, name)
        need(value is None or value >= 1, f"judge.{name} must be >= 1 (or null: the rule), got {value}")
    need(args.judge.bin is None or args.judge.bin <= args.target,
         f"judge.bin {args.judge.bin} is wider than the window it bins (the target {args.target})")
    for name in ("seq_len", "longce_window"):
        value = getattr(args.train, name)
        need(value is None or value >= 1, f"train.{name} must be >= 1 token (or null: the rule), got {value}")
    need(args.train.short_steps is None or args.train.short_steps >= 0,
         f"train.short_steps must be >= 0 (0: no short stage; null: the rule), got {args.train.short_steps}")
    need(args.train.short_lr is None or (math.isfinite(args.train.short_lr) and args.train.short_lr > 0),
         f"train.short_lr must be > 0 (or null: lr / 2), got {args.train.short_lr}")
    share = args.train.short_long_share
    need(share is None or (math.isfinite(share) and 0 <= share < 1),
         f"train.short_long_share must be in [0, 1) (0: contiguous windows alone; null: the rule), got {share}")
    need(args.tokens >= 0, f"--tokens must be >= 0 (0: the rule), got {args.tokens}")
    need(math.isfinite(args.hours) and 0 <= args.hours <= 8760, f"--hours must be a number from 0 to 8760 (a year; "
                                                                 f"0: --tokens' rule), got {args.hours}")
    floor = args.search.critical_floor
    need(floor is None or (isinstance(floor, (int, float)) and math.isfinite(floor) and floor >= 1),
         f"search.critical_floor must be a number >= 1 (a multiple of s; null: the rule), got {floor}")
    need(not (args.tokens and args.hours),
         f"--tokens {args.tokens} and --hours {args.hours:g} both set the fine-tune's length: give one")
    need(args.judge.mode in JUDGE_MODES, f"judge.mode must be one of {', '.join(JUDGE_MODES)}, got {args.judge.mode!r}")
    if not args.output_dir.strip():
        model = Path(args.model.name).expanduser()
        name = (model.resolve() if model.exists() else model).name   # `--model .`: the folder's own name
        args.output_dir = f"runs/extend_{name.removesuffix('.gguf')}_{args.target}"
    return args
