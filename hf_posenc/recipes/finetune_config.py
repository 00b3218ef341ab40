"""The fine-tune recipe's config (recipes/finetune.py): its sections as typed dataclasses, each field with
its default and a one-line doc, each section checking its own values. `parse_config` reads a YAML file and
`--section.field` flags through the recipes' one config system (hf_posenc/recipes/recipe_config.py)."""

from __future__ import annotations

import dataclasses
import math
import sys
from dataclasses import field
from typing import Optional, Union

from ..errors import ConfigError, PosEncError
from . import recipe_config
from ..train.trainable import GROUPS
from .recipe_config import ADJUSTABLE, FIXED, need

# Plain Python only at import (torch, the position schemes and accelerate load inside the checks that need
# them): `--help` reads these dataclasses and answers without torch (tests/test_help_speed.py).



# What --resume may change, declared on every field (tests/test_finetune_phases.py checks each has it):
# FIXED settings make the run what it is (the model, the patch, the data, the optimizer, the schedule, the seed,
# the position ids): a resume that changes one is refused, naming it (finetune_checks.check_resume). ADJUSTABLE
# ones change how the run is watched, saved or computed, not what it trains (steps to extend it, the save and
# evaluation cadence, logging, memory knobs): a resume takes them and says which changed. PER_COMMAND ones say
# how this command starts (output_dir, --resume, --overwrite_output_dir): not settings of the run, not compared.
PER_COMMAND = {"resume_may_change": True, "per_command": True}

PACKINGS = ("joined", "documents")   # data.packing
ATTENTIONS = ("full", "s2")   # train.attention


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


@dataclasses.dataclass
class FinetuneModelArgs(recipe_config.ModelArgs):
    """The model section every recipe has, and what only training reads."""

    gguf_file: Optional[str] = field(default=None, metadata={**FIXED,
        "help": "the .gguf file inside a hub repo or folder named by name"})
    gradient_checkpointing: bool = field(default=False, metadata={**ADJUSTABLE,
        "help": "recompute activations in the backward pass (less memory, more time)"})


@dataclasses.dataclass
class FinetuneDataArgs(recipe_config.DataArgs):
    """The data section every recipe has (the corpus, its split and column, the framing), and how the fine-tune
    packs it into training windows."""

    streaming: bool = field(default=False, metadata={**FIXED,
        "help": "hub datasets: stream and keep the first max_documents"})
    max_documents: Optional[int] = field(default=None, metadata={**FIXED,
        "help": "use the first N documents only (null: all)"})
    seq_len: Optional[int] = field(default=None, metadata={**FIXED,
        "help": "tokens per training sequence (null: the patched context)"})
    short_share: float = field(default=0.0, metadata={**FIXED,
        "help": "share of sequences cut to short_len (keeps short-context quality)"})
    short_len: Optional[int] = field(default=None, metadata={**FIXED,
        "help": "length of the short sequences (null: the original context)"})
    packing: str = field(default="joined", metadata={**FIXED,
        "help": "joined: documents packed end to end, EOS between them, a window's tokens attend across them; "
                "documents: each document kept apart inside its window (position ids restart after each EOS, no "
                "attention across it: document masking, hf_posenc/train/documents.py)"})
    shuffle: bool = field(default=True, metadata={**FIXED, "help": "shuffle the packed sequences each epoch"})
    cache_dir: Optional[str] = field(default=None, metadata={**ADJUSTABLE,
        "help": "where packed data is cached (null: $HF_POSENC_CACHE/data)"})

    def __post_init__(self):
        super().__post_init__()
        if self.seq_len is not None and self.seq_len < 2:
            raise ConfigError(f"data.seq_len must be >= 2, got {self.seq_len}")
        if not 0.0 <= self.short_share < 1.0:
            raise ConfigError(f"data.short_share must be in [0, 1), got {self.short_share}")
        need(self.packing in PACKINGS, f"data.packing must be one of {', '.join(PACKINGS)} (documents: attention "
                                        f"kept inside each document), got {self.packing!r}")
        if self.streaming and not self.max_documents:
            raise ConfigError("data.streaming needs data.max_documents (how many documents to take from the stream)")
        need(self.max_documents is None or self.max_documents >= 1,
              f"data.max_documents must be >= 1 (or null), got {self.max_documents}")
        need(self.short_len is None or self.short_len >= 2,
             f"data.short_len must be >= 2 (or null), got {self.short_len}")


@dataclasses.dataclass
class TrainArgs:
    objective: str = field(default="lm", metadata={**FIXED,
        "help": "lm (next-token loss) or distill (match the unpatched model at the original context)"})
    steps: int = field(default=400, metadata={**ADJUSTABLE, "help": "optimizer steps"})
    batch_size: int = field(default=1, metadata={**FIXED, "help": "sequences per process per micro-batch"})
    grad_accum: int = field(default=1, metadata={**FIXED, "help": "micro-batches per optimizer step"})
    lr: float = field(default=2e-5, metadata={**FIXED, "help": "AdamW learning rate"})
    betas: list = field(default_factory=lambda: [0.9, 0.95], metadata={**FIXED, "help": "AdamW's beta1, beta2"})
    weight_decay: float = field(default=0.0, metadata={**FIXED, "help": "AdamW weight decay"})
    eps: float = field(default=1e-8, metadata={**FIXED, "help": "AdamW epsilon"})
    scheduler: str = field(default="constant_with_warmup", metadata={**FIXED,
        "help": "any transformers.get_scheduler name that needs no metric"})
    warmup_steps: int = field(default=20, metadata={**FIXED, "help": "steps of learning-rate warmup"})
    max_grad_norm: Optional[float] = field(default=1.0, metadata={**FIXED,
        "help": "clip the gradient norm to this (null: no clipping)"})
    trainable: Union[str, list] = field(default="all", metadata={**FIXED,
        "help": "all, or a list of groups (embeddings, norms, attention, mlp, head) / regexes"})
    lora: Optional[dict] = field(default=None, metadata={**FIXED,
        "help": "LoRA adapters {r, alpha, dropout, target_modules} (needs peft); null: none"})
    temperature: float = field(default=1.0, metadata={**FIXED, "help": "distill, causal LMs: KL at this temperature"})
    teacher: str = field(default="unpatched", metadata={**FIXED,
        "help": "distill: the model matched, unpatched (inside the original context) or self_extend [group_size=G "
                "window=W] (the same weights with Self-Extend to the patched context, at the window's ids: a "
                "PoSE window's spread ids too) (hf_posenc/train/teacher.py)"})
    seed: int = field(default=42, metadata={**FIXED, "help": "seed of the data order, the initialisation and dropout"})
    save_every: int = field(default=100, metadata={**ADJUSTABLE,
        "help": "accelerator.save_state every N steps (and at the end)"})
    keep_checkpoints: int = field(default=2, metadata={**ADJUSTABLE,
        "help": "checkpoints kept (the oldest are removed)"})
    report_to: Optional[str] = field(default=None, metadata={**ADJUSTABLE,
        "help": "accelerate tracker: tensorboard, wandb, all, ... (null: none)"})
    stop_after_steps: Optional[int] = field(default=None, metadata={**ADJUSTABLE,
        "help": "stop (as if killed) after this many steps; for testing resume"})
    loss_chunk: int = field(default=1024, metadata={**ADJUSTABLE,
        "help": "causal LMs: output layer + loss this many positions at a time (0: all at once)"})
    positions: str = field(default="contiguous", metadata={**FIXED,
        "help": "position ids of each training window: contiguous (0..n-1), or spread over a longer target so "
                "that a short window teaches long distances: 'pose chunks=2', 'cream', 'randomized'; each takes "
                "target=N (default: the patched context), contiguous_share=S and text=span (each window's tokens "
                "taken at its ids from a target-long span: the text's own distances) (hf_posenc/train/positions.py)"})
    attention: str = field(default="full", metadata={**FIXED,
        "help": "full, or s2: LongLoRA's shifted sparse attention in training (attention inside groups of s2_group "
                "tokens, half the heads on groups shifted by half a group); the saved model and every evaluation "
                "use full attention (hf_posenc/train/s2_attention.py)"})
    s2_group: Optional[int] = field(default=None, metadata={**FIXED,
        "help": "s2: tokens per attention group, dividing data.seq_len (null: a quarter of it, LongLoRA's)"})
    s2_shift: bool = field(default=True, metadata={**FIXED,
        "help": "s2: half the heads see the groups shifted by s2_group / 2 (false: plain groups)"})
    loss: str = field(default="ce", metadata={**FIXED,
        "help": "the training loss: ce (cross-entropy), or longce: each token's loss weighted by min(P(long) / "
                "P(short), longce_clip), the short-context probability computed by the model without gradient in "
                "the same step (Fang et al. 2025); a loss's settings are train.<loss>_* (docs/finetune.md's table "
                "of train.loss; hf_posenc/train/losses.py LOSSES)"})
    mixed_windows: float = field(default=0.0, metadata={**FIXED,
        "help": "share of micro-batches trained inside the original context with the short rope, the rest with "
                "the target's (LongRoPE2's mixed context windows); the run trains and saves the patch as a "
                "switched longrope (hf_posenc/train/mixed_windows.py); 0: off"})
    longce_window: Optional[int] = field(default=None, metadata={**FIXED,
        "help": "longce: the short context in tokens (null: the original context)"})
    longce_stride: Optional[int] = field(default=None, metadata={**FIXED,
        "help": "longce: tokens scored per short forward, each with longce_window .. longce_window + stride - 1 "
                "tokens of context (null: longce_window)"})
    longce_clip: float = field(default=5.0, metadata={**FIXED,
        "help": "longce: the largest weight a token gets (the paper's gamma)"})
    longce_floor: float = field(default=0.0, metadata={**FIXED,
        "help": "longce: the smallest weight a token gets, in [0, 1] (0: the paper's; 1: a token the long context "
                "does not help keeps its plain loss)"})

    def __post_init__(self):
        if self.objective not in ("lm", "distill"):
            raise ConfigError(f"train.objective must be 'lm' or 'distill', got {self.objective!r}")
        for name in ("steps", "batch_size", "grad_accum", "save_every"):
            if getattr(self, name) < 1:
                raise ConfigError(f"train.{name} must be >= 1, got {getattr(self, name)}")
        if not (isinstance(self.betas, list) and len(self.betas) == 2 and all(map(_is_number, self.betas))
                and all(0 <= b < 1 for b in self.betas)):
            raise ConfigError(f"train.betas must be a list of two numbers in [0, 1) (AdamW's beta1, beta2), "
                              f"got {self.betas!r}")
        self.betas = [float(b) for b in self.betas]
        if not (self.lr > 0 and math.isfinite(self.lr)):
            raise ConfigError(f"train.lr must be a positive number, got {self.lr}")
        for name in ("weight_decay", "eps", "warmup_steps", "seed"):
            need(0 <= getattr(self, name) < math.inf, f"train.{name} must be >= 0, got {getattr(self, name)}")
        need(self.max_grad_norm is None or 0 < self.max_grad_norm < math.inf,
              f"train.max_grad_norm must be a positive number (or null: no clipping), got {self.max_grad_norm}")
        need(0 < self.temperature < math.inf, f"train.temperature must be a positive number, got {self.temperature}")
        from ..train import teacher as train_teacher

        need(self.objective == "distill" or train_teacher.parse(self.teacher)[0] == "unpatched",
              f"train.teacher={self.teacher!r} is the model train.objective=distill matches; this run's objective is "
              f"{self.objective!r}")
        need(_is_number(self.mixed_windows) and 0 <= self.mixed_windows < 1,
              f"train.mixed_windows must be a share in [0, 1) (0: off; the rest are long windows), "
              f"got {self.mixed_windows!r}")
        need(self.loss_chunk >= 0, f"train.loss_chunk must be >= 0 (0: the full logits at once), got {self.loss_chunk}")
        need(self.keep_checkpoints >= 1, f"train.keep_checkpoints must be >= 1 (--resume needs one), "
                                          f"got {self.keep_checkpoints}")
        need(self.stop_after_steps is None or self.stop_after_steps >= 1,
              f"train.stop_after_steps must be >= 1 (or null), got {self.stop_after_steps}")
        trainable = [self.trainable] if isinstance(self.trainable, str) else self.trainable
        need(isinstance(trainable, list) and trainable and all(isinstance(t, str) and t for t in trainable),
              f"train.trainable must be 'all', a group ({', '.join(GROUPS)}) or a regex, or a list of them; "
              f"got {self.trainable!r}")
        if self.report_to is not None:
            from accelerate.utils import LoggerType

            trackers = [t.value for t in LoggerType]
            need(self.report_to in trackers, f"train.report_to={self.report_to!r} is not one of {', '.join(trackers)}"
                                              f" (or null)")
        if self.lora is not None:
            self.lora = check_lora(self.lora)
        need(self.attention in ATTENTIONS, f"train.attention must be one of {', '.join(ATTENTIONS)} (s2: LongLoRA's "
                                            f"shifted sparse attention in training), got {self.attention!r}")
        from ..train.losses import LOSSES

        need(self.loss in LOSSES, f"train.loss must be one of {', '.join(LOSSES)} (docs/finetune.md's table of "
                                   f"train.loss), got {self.loss!r}")
        need(self.s2_group is None or (isinstance(self.s2_group, int) and not isinstance(self.s2_group, bool)
                                        and self.s2_group >= 2),
              f"train.s2_group must be an int >= 2 (tokens per attention group) or null (a quarter of data.seq_len), "
              f"got {self.s2_group!r}")
        need(isinstance(self.s2_shift, bool), f"train.s2_shift must be true or false, got {self.s2_shift!r}")
        from ..train.positions import scheme

        try:
            scheme(self.positions)
        except PosEncError as err:
            raise ConfigError(f"train.positions={self.positions!r}: {err}") from None


@dataclasses.dataclass
class FinetuneEvalArgs:
    """The fine-tune's own check of its model: perplexity (encoders: embedding cosine) at a few lengths before, during
    and after training. The evaluate recipe's section, hf_posenc/recipes/evaluate_config.py, measures far more."""

    lengths: list = field(default_factory=list, metadata={**ADJUSTABLE,
        "help": "perplexity (encoders: embedding cosine) at these lengths, before and after training"})
    corpus: Optional[str] = field(default=None, metadata={**ADJUSTABLE,
        "help": "held-out text to evaluate on (null: data.corpus, the training text itself: not held out)"})
    documents: int = field(default=4, metadata={**ADJUSTABLE, "help": "documents evaluated at each length"})
    every: Optional[int] = field(default=None, metadata={**ADJUSTABLE,
        "help": "also evaluate every N steps during training (into log.jsonl)"})

    def __post_init__(self):
        lengths = [self.lengths] if _is_number(self.lengths) else self.lengths   # `lengths: 512` means [512]
        need(isinstance(lengths, list) and all(isinstance(n, int) and not isinstance(n, bool) and n >= 2
                                                 for n in lengths),
              f"eval.lengths must be a list of token counts >= 2 (e.g. [512, 1024]), got {self.lengths!r}")
        self.lengths = lengths
        need(self.documents >= 1, f"eval.documents must be >= 1, got {self.documents}")
        need(self.every is None or self.every >= 1, f"eval.every must be >= 1 (or null), got {self.every}")
        need(self.corpus is None or bool(self.corpus.strip()), "eval.corpus must name a corpus or be null, got ''")


@dataclasses.dataclass
class FinetuneConfig:
    """The fine-tune recipe's config: its YAML file's sections and top-level keys."""

    model: FinetuneModelArgs = field(default_factory=FinetuneModelArgs,
                                     metadata={"help": "the checkpoint and how it loads"})
    data: FinetuneDataArgs = field(default_factory=FinetuneDataArgs,
                                   metadata={"help": "the training text and how it is packed"})
    train: TrainArgs = field(default_factory=TrainArgs, metadata={"help": "objective, optimizer, what trains"})
    eval: FinetuneEvalArgs = field(default_factory=FinetuneEvalArgs,
                                   metadata={"help": "evaluation before and after training"})
    posenc: Optional[dict] = field(default=None, metadata={**FIXED,
        "help": "the patch: {method: NAME, max_position_embeddings: N | factor: F, ...} (hf-posenc methods lists "
                "them); null: none"})
    output_dir: str = field(default="outputs/finetune", metadata={**PER_COMMAND,
        "help": "where the model, logs and checkpoints go"})
    overwrite_output_dir: bool = field(default=False, metadata={**PER_COMMAND, "help": "replace an existing output_dir"})
    resume: bool = field(default=False, metadata={**PER_COMMAND,
        "help": "continue from the latest checkpoint in output_dir (the same run: a change of its settings "
                "is refused, naming it; steps, cadence and logging may change)"})

    def __post_init__(self):
        if not self.output_dir.strip():
            raise ConfigError(f"output_dir must be a folder path, got {self.output_dir!r}")
        if self.posenc is not None and not (isinstance(self.posenc, dict) and "method" in self.posenc):
            raise ConfigError(f"posenc must be a mapping with a 'method' (e.g. {{method: yarn, factor: 4}}), "
                              f"got {self.posenc!r}")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


USAGE = "--config FILE.yaml [--section.field VALUE ...] [--resume] [--overwrite_output_dir]"   # after the command
ABOUT = ("Fine-tune a patched model at its new context (recipes/finetune.py; accelerate launch for several "
         "processes).")




def parse_config(argv: list[str] | None = None, prog: str | None = None) -> FinetuneConfig:
    """`--config FILE.yaml` then overrides: `--train.lr 1e-4`, `--posenc.factor 4`, `--output_dir d`,
    `--resume`, `--overwrite_output_dir` (hf_posenc/recipes/recipe_config.py)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv:   # not a 400-step SmolLM2 run by surprise
        raise ConfigError("no config given: pass --config FILE.yaml (recipes/configs/) and/or --section.field "
                          "overrides; --help lists every field")
    return recipe_config.parse(FinetuneConfig, argv, usage=f"{recipe_config.program('finetune', prog)} {USAGE}", about=ABOUT,
                               shipped=lambda name: name.endswith("_finetune"))


LORA_KEYS = ("r", "alpha", "dropout", "target_modules")


def check_lora(lora) -> dict:
    need(isinstance(lora, dict), f"train.lora must be a mapping ({', '.join(LORA_KEYS)}), got {lora!r}")
    unknown = sorted(set(lora) - set(LORA_KEYS))
    need(not unknown, f"unknown key(s) {unknown} in train.lora; allowed: {', '.join(LORA_KEYS)}")
    r, alpha, dropout = lora.get("r", 8), lora.get("alpha", 16), lora.get("dropout", 0.0)
    need(isinstance(r, int) and not isinstance(r, bool) and r >= 1, f"train.lora.r must be an int >= 1, got {r!r}")
    need(isinstance(alpha, int) and not isinstance(alpha, bool) and alpha >= 1,
          f"train.lora.alpha must be an int >= 1, got {alpha!r}")
    need(_is_number(dropout) and 0 <= dropout < 1, f"train.lora.dropout must be in [0, 1), got {dropout!r}")
    targets = lora.get("target_modules", "all-linear")
    need(isinstance(targets, str) and targets or isinstance(targets, list) and targets
          and all(isinstance(t, str) and t for t in targets),
          f"train.lora.target_modules must be 'all-linear', a regex or a list of module names, got {targets!r}")
    return lora
