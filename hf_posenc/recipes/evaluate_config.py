"""The evaluate recipe's config (recipes/evaluate.py): its sections as typed dataclasses (`model` and `data` are
the recipes' shared ones, hf_posenc/recipes/recipe_config.py; `eval` is this recipe's: the variants and what is
measured), `parse_args` (a YAML file and `--section.field` flags) and every check that needs no weights: the values
in range, and from the model's config alone that each variant applies and no length is far past every context in
play. A refusal is one ConfigError, before anything is written."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from hf_posenc import user_input
from hf_posenc.config import MAX_POSITIONS
from hf_posenc.errors import ConfigError
from hf_posenc.recipes import recipe_config
from hf_posenc.recipes.recipe_config import need

# torch, transformers and the measures (hf_posenc.eval) load inside the functions that use them, once the
# config is read: `--help` answers without them (tests/test_help_speed.py).


@dataclass
class EvalArgs:
    variants: list[str] = field(default_factory=lambda: ["none", "yarn"],
                                metadata={"help": "'none' or a method with parameters: 'yarn beta_fast=16'"})
    max_position_embeddings: list[int] = field(default_factory=lambda: [16384],
                                               metadata={"help": "target context(s) of the patched variants"})
    grid: list[str] = field(default_factory=list, metadata={
        "help": "parameter grids, 'yarn beta_fast=16|32 attention_factor=1|1.1': every point is scored on the "
                "tuning documents, the best one evaluated as a variant on the held-out ones"})
    tune_documents: int = field(default=1, metadata={"help": "documents the grid is scored on (held out from the rest)"})
    tune_length: int = field(default=0, metadata={"help": "tokens the grid is scored at (0: the longest perplexity length)"})
    perplexity_lengths: list[int] = field(default_factory=list, metadata={
        "help": "per-document perplexity of each document truncated to each length (the papers' measure)"})
    perplexity_documents: int = field(default=2, metadata={"help": "documents scored at perplexity_lengths"})
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
    seed: int = field(default=0, metadata={"help": "seed of the retrieval trials and the recall passages"})
    recall_lengths: list[int] = field(default_factory=list, metadata={
        "help": "recall at a distance (passages repeated later in one sequence, against a control pass) at each "
                "length"})
    recall_passages: int = field(default=24, metadata={
        "help": "passages a recall cell (the n of its interval), over as many sequences as the density needs"})
    recall_passage_tokens: int = field(default=192, metadata={"help": "tokens of each recall passage"})
    recall_distances: list[int] = field(default_factory=list, metadata={
        "help": "distances (tokens) from each first copy to its repeat; empty: spread over the whole length"})
    recall_corpus: str = field(default="", metadata={
        "help": "the held-out text of the recall passages (a load_corpus spec; empty: data.corpus)"})
    recall_control: bool = field(default=True, metadata={
        "help": "a control pass per sequence (false: the first copy's own loss as the baseline, half the cost, "
                "wrong where the model breaks down)"})
    recall_bin: int = field(default=0, metadata={"help": "width of the distance bins (0: length / 8)"})
    tasks: list[str] = field(default_factory=list, metadata={
        "help": "retrieval families of RULER (passkey, single, multikey, multivalue, multiquery, vt; the table of "
                "families in docs/evaluate.md), each at task_lengths"})
    task_lengths: list[int] = field(default_factory=list, metadata={"help": "context lengths of eval.tasks"})
    task_samples: int = field(default=8, metadata={"help": "samples per (task, length)"})
    task_needles: int = field(default=4, metadata={
        "help": "needles of a sample, for the families that read them (multikey, multivalue, multiquery, ...: "
                "docs/evaluate.md's table)"})
    task_hops: int = field(default=4, metadata={
        "help": "links of the variable-tracking chain, for the families that read them (vt, ...: docs/evaluate.md's "
                "table)"})


@dataclass
class EvalConfig:
    model: recipe_config.ModelArgs = field(default_factory=recipe_config.ModelArgs,
                                           metadata={"help": "the model and how it loads"})
    data: recipe_config.DataArgs = field(default_factory=recipe_config.DataArgs,
                                         metadata={"help": "the text scored, and how inputs start"})
    eval: EvalArgs = field(default_factory=EvalArgs, metadata={"help": "the variants, and what is measured"})
    output_dir: str = field(default="runs/eval", metadata={"help": "results.json, summary.md and the figures"})
    resume: bool = field(default=True, metadata={"help": "skip the variants results.json already holds"})
    overwrite: bool = field(default=False, metadata={"help": "replace a results.json of another configuration"})
    plots: bool = field(default=True, metadata={"help": "draw the figures"})


OUTPUT_ONLY = ("output_dir", "resume", "overwrite", "plots")  # fields that do not change what is measured
MEASURES = ("perplexity_lengths", "curve_length", "strided_windows", "passkey_lengths", "needle_lengths", "grid",
            "recall_lengths", "task_lengths")
USAGE = "[--config FILE.yaml] [--section.field VALUE ...] [--overwrite]"   # after the command
ABOUT = ("Evaluate positional variants of one model: perplexity against context length, by position and with a "
         "sliding window, passkey and needle retrieval, recall at a distance, RULER's retrieval families, and "
         "parameter grids tuned on some documents and checked on others. Writes results.json (after every cell: a "
         "rerun resumes), summary.md and figures to output_dir.")


def parse_args(argv: list[str] | None = None, prog: str | None = None) -> EvalConfig:
    """YAML (--config) first, then the command line over it (hf_posenc/recipes/recipe_config.py); every value
    checked (`check_args`)."""
    args = recipe_config.parse(EvalConfig, argv, usage=f"{recipe_config.program('evaluate', prog)} {USAGE}",
                               about=ABOUT, shipped=lambda name: name.startswith("eval_"))
    check_args(args)
    return args


def check_args(args: EvalConfig) -> None:
    """Every value in range, before anything is loaded or written."""
    from hf_posenc import eval as hpe

    ev = args.eval
    need(bool(args.output_dir.strip()), "output_dir is empty")   # the model and data sections check their own
    need(bool(ev.variants), "eval.variants is empty: nothing to evaluate; give at least one, e.g. [none, yarn]")
    need(bool(ev.max_position_embeddings),
         "eval.max_position_embeddings is empty: give the target context(s) of the patched variants, e.g. [16384]")
    for spec in ev.variants:
        hpe.parse_variant(spec)  # an unknown method stops here, before any loading
    for spec in ev.grid:
        hpe.expand_grid(spec)
    for name in ("variants", "max_position_embeddings", "grid"):
        values = getattr(ev, name)
        need(len(set(values)) == len(values), f"eval.{name} lists a value twice: {values}")
    for name, least in (("max_position_embeddings", 2), ("perplexity_lengths", 2), ("strided_windows", 2),
                        ("passkey_lengths", 1), ("needle_lengths", 1), ("recall_lengths", 2), ("task_lengths", 2)):
        values = getattr(ev, name)
        need(all(v >= least for v in values), f"eval.{name} must hold token counts >= {least}, got {values}")
        need(all(v <= MAX_POSITIONS for v in values),
             f"eval.{name} must hold token counts <= {MAX_POSITIONS} (the most positions hf_posenc takes), got {values}")
    for name in ("perplexity_documents", "tune_documents", "curve_documents", "curve_bucket", "trials"):
        need(getattr(ev, name) >= 1, f"eval.{name} must be >= 1, got {getattr(ev, name)}")
    for name in ("tune_length", "curve_length"):
        value = getattr(ev, name)
        need(value == 0 or 2 <= value <= MAX_POSITIONS,
             f"eval.{name} must be 0 (off) or a token count >= 2 (and <= {MAX_POSITIONS}), got {value}")
    need(2 <= ev.strided_tokens <= MAX_POSITIONS,
         f"eval.strided_tokens must be >= 2 (and <= {MAX_POSITIONS}), got {ev.strided_tokens}")
    need(0 <= ev.strided_stride <= min(ev.strided_windows, default=ev.strided_stride),
         f"eval.strided_stride must be 0 (half the window) or in 1..{min(ev.strided_windows, default=0)} (the "
         f"smallest of eval.strided_windows), got {ev.strided_stride}")
    need(all(0 <= d <= 1 for d in ev.depths), f"eval.depths must be fractions in [0, 1], got {ev.depths}")
    need(bool(ev.depths) or not (ev.passkey_lengths or ev.needle_lengths),
         "eval.depths is empty; eval.passkey_lengths / eval.needle_lengths need at least one depth")
    check_recall_and_tasks(ev, need)
    need(any(getattr(ev, name) for name in MEASURES),
         f"nothing to measure: set at least one of {', '.join(f'eval.{name}' for name in MEASURES)}")
    need(not ev.grid or bool(ev.tune_length or ev.perplexity_lengths),
         "eval.grid needs eval.tune_length (or eval.perplexity_lengths, whose longest is the default)")


def recall_plan(ev: EvalArgs, length: int) -> tuple[int, int]:
    """(passages a sequence, sequences) of a recall cell at `length` (hf_posenc.eval.recall.cell_sequences)."""
    from hf_posenc.eval import recall

    return recall.cell_sequences(length, ev.recall_passages, ev.recall_passage_tokens)


def check_recall_and_tasks(ev: EvalArgs, need) -> None:
    """Recall cells that cannot fit and retrieval families that do not exist, refused from the numbers alone."""
    from hf_posenc.eval import recall, ruler

    for name in ("recall_passages", "recall_passage_tokens", "task_samples"):
        need(getattr(ev, name) >= 1, f"eval.{name} must be >= 1, got {getattr(ev, name)}")
    need(ev.recall_bin >= 0, f"eval.recall_bin must be 0 (length / 8) or a token count, got {ev.recall_bin}")
    need(not ev.recall_distances or bool(ev.recall_lengths),
         "eval.recall_distances needs eval.recall_lengths (the lengths to measure recall at)")
    for length in ev.recall_lengths:
        try:   # the cell's plan and its layout: both bound the length (recall.MAX_LENGTH)
            per_sequence, _ = recall_plan(ev, length)
            recall.plan_layout(length, passages=per_sequence, passage_tokens=ev.recall_passage_tokens,
                               distances=ev.recall_distances or None, head=1, seed=ev.seed)
        except ValueError as err:
            raise ConfigError(f"eval.recall_lengths {length}: {err}") from None
    unknown = [t for t in ev.tasks if t not in ruler.TASKS]
    need(not unknown, f"eval.tasks: unknown {', '.join(map(repr, unknown))}; the families are "
                      f"{', '.join(ruler.TASKS)}")
    need(len(set(ev.tasks)) == len(ev.tasks), f"eval.tasks lists a family twice: {ev.tasks}")
    need(bool(ev.tasks) == bool(ev.task_lengths),
         "eval.tasks and eval.task_lengths go together: the families, and the lengths to run them at")
    need(2 <= ev.task_needles <= len(ruler.KEYS),
         f"eval.task_needles must be in 2..{len(ruler.KEYS)}, got {ev.task_needles}")
    need(ev.task_hops >= 1, f"eval.task_hops must be >= 1, got {ev.task_hops}")
    need(bool(ev.depths) or not ev.tasks, "eval.depths is empty; eval.tasks needs at least one depth")




def check_model_and_paths(args: EvalConfig) -> str:
    """The model reference (checked like the CLI's) and, from its config alone, that it is a causal LM, that
    every variant's method applies to it and that no length is far past every context in play; output_dir
    neither a file nor an input. Returns the reference."""
    from hf_posenc import corpora
    from hf_posenc import eval as hpe

    ref = user_input.model_ref(args.model.name)
    inputs = [p for p in (Path(ref), *corpora.corpus_paths(args.data.corpus)) if p.is_dir()]
    user_input.output_folder(args.output_dir, "output_dir", inputs)
    methods = {spec.split()[0] for spec in [*args.eval.variants, *args.eval.grid]} - {hpe.variants.NONE}
    skeleton = user_input.model_skeleton(ref, methods=sorted(methods), causal_lm_for="the evaluate recipe")
    check_length_bound(args, int(getattr(skeleton.config.get_text_config(), "max_position_embeddings", 0) or 0))
    return ref


# How far past the longest context in play a length may go: far enough to show where every variant breaks
# down, and a bound on a typo ([10000000]), whose inputs would otherwise be built until memory runs out.
PAST_CONTEXT = 32


def check_length_bound(args: EvalConfig, own: int) -> None:
    """Every length at most PAST_CONTEXT times the longest context in play (the model's own, each target)."""
    ev = args.eval
    longest = max([own, *ev.max_position_embeddings])
    bound = PAST_CONTEXT * longest
    for name in LENGTH_FIELDS:
        value = getattr(ev, name)
        for length in value if isinstance(value, list) else [value]:
            if length > bound:
                raise ConfigError(
                    f"eval.{name} {length} is past {bound} tokens, the most a length may be: {PAST_CONTEXT} x the "
                    f"longest context in play ({longest}: the model's own {own} and eval.max_position_embeddings "
                    f"{ev.max_position_embeddings}); use lengths up to {bound}, or a larger target")


LENGTH_FIELDS = ("perplexity_lengths", "tune_length", "curve_length", "strided_windows", "passkey_lengths",
                 "needle_lengths", "recall_lengths", "task_lengths")   # the input lengths a measure asks for


def max_length(args: EvalConfig) -> int:
    """The longest input any measure asks of the model."""
    ev = args.eval
    return max([ev.curve_length, ev.tune_length, *ev.perplexity_lengths, *ev.strided_windows, *ev.passkey_lengths,
                *ev.needle_lengths, *ev.recall_lengths, *ev.task_lengths])


def variant_runs(args: EvalConfig) -> list[tuple[str, str, int]]:
    """(label, spec, target) for each evaluation: "none" once, the others at each target."""
    from hf_posenc import eval as hpe

    targets = args.eval.max_position_embeddings
    sweep = len(targets) > 1
    return [(spec if spec == hpe.variants.NONE or not sweep else f"{spec} @{target}", spec, target)
            for spec in args.eval.variants
            for target in (targets[:1] if spec == hpe.variants.NONE else targets)]
