"""The model card of a fine-tuned folder (recipes/finetune.py): what was patched, trained and measured."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .finetune_checks import Preflight
    from .finetune_config import FinetuneConfig


def positions_line(preflight: Preflight, cfg: FinetuneConfig, steps: int, processes: int | None = None) -> str:
    """How the training windows were numbered (train.positions), and the largest distance their ids put in
    front of attention, read from the ids the run drew (those of windows 0..W-1 for (train.seed, W), W the
    windows of `steps` steps on `processes` processes; None: accelerate's, as the recipe ran), not from what
    the scheme's target allows."""
    scheme = preflight.positions
    if not scheme.spreads:
        return f"contiguous (0..n-1): the model saw distances up to {preflight.seq_len - 1} in training"
    if processes is None:
        from accelerate import PartialState

        processes = PartialState().num_processes
    windows = max(1, steps * cfg.train.grad_accum * cfg.train.batch_size * processes)
    largest = scheme.largest_distance(preflight.seq_len, seed=cfg.train.seed, windows=windows)
    tokens = (f", each window's tokens taken at its ids from a span of {scheme.target} tokens of the text (the "
              f"distances are the text's own)" if scheme.span else "")
    short = ("; the windows data.short_share cut short kept 0..n-1" if cfg.data.short_share and not scheme.span
             else "")
    if preflight.long_training.document_mask:   # the ids of each document start at 0 in its window
        short += "; documents kept apart: only a document that spans those ids trains their distance"
    return (f"`{scheme.spec}`: windows of {preflight.seq_len} tokens given ids in [0, {scheme.target}) "
            f"(hf_posenc.train.positions){tokens}; the ids drawn for its {windows:,} windows put distances up to "
            f"{largest} in front of attention (the target allows {scheme.target - 1}{short})")


def write_model_card(output_dir: str, cfg: FinetuneConfig, preflight: Preflight, describe: dict, steps: int,
                     tokens: int, before: dict, after: dict) -> None:
    from .patch_card import front_matter, hub_id

    hub = hub_id(cfg.model.name)
    local = Path(cfg.model.name).expanduser().exists() and hub != cfg.model.name
    base = (f"{hub or Path(cfg.model.name).expanduser().name}"
            + (f" (from the local folder `{Path(cfg.model.name).expanduser().name}`)" if local and hub else "")
            + (f" ({cfg.model.gguf_file})" if cfg.model.gguf_file else ""))
    rows = "\n".join(f"| {k} | {before.get(k, '')} | {after.get(k, '')} |" for k in sorted({*before, *after}))
    evaluation = (f"| metric | before | after |\n|---|---|---|\n{rows}\n" if rows else "not run\n")
    held_out = bool(cfg.eval.corpus) and cfg.eval.corpus != cfg.data.corpus
    evaluated_on = (f"held-out `{corpus_name(cfg.eval.corpus)}`" if held_out else
                    f"`{corpus_name(cfg.data.corpus)}`, the training text itself: not held out (eval.corpus names other text)")
    switched = (", trained and saved as a switched `longrope` (mixed windows: the unpatched frequencies inside the "
                "original context)" if preflight.long_training.switched else "")
    header = "\n".join(front_matter(cfg.model.name))
    card = f"""{header}
# {Path(output_dir).name}

Fine-tuned with `hf_posenc` (`recipes/finetune.py`).

- **Base model**: `{base}` (context {preflight.original_context})
- **Positional patch**: `{json.dumps(cfg.posenc) if cfg.posenc else 'none'}` -> context {preflight.target_context}{switched}
- **Mechanism after patch**: `{json.dumps(describe, default=str)}`{'' if cfg.posenc else ' (the rope scaling the start folder carries)' if describe else ' (the positions as loaded: no scaling)'}
- **Data**: `{corpus_name(cfg.data.corpus)}` (split {cfg.data.split}{f', first {cfg.data.max_documents} documents' if cfg.data.max_documents else ''}), packed to {preflight.seq_len} tokens{f', {cfg.data.short_share:.0%} cut to {preflight.short_len}' if cfg.data.short_share else ''}
- **Position ids**: {positions_line(preflight, cfg, steps)}
- **Objective**: `{cfg.train.objective}`{objective_teacher(cfg)}; trainable: `{cfg.train.trainable}`{'; LoRA ' + json.dumps(cfg.train.lora) + ' (merged)' if cfg.train.lora else ''}
- **Attention and loss in training**: {preflight.long_training.describe()}
- **Steps**: {steps} optimizer step{'' if steps == 1 else 's'}, {tokens} training tokens; lr {cfg.train.lr}, betas {cfg.train.betas}, weight decay {cfg.train.weight_decay}, warmup {cfg.train.warmup_steps}, {cfg.train.scheduler}, seed {cfg.train.seed}

## Evaluation (on {evaluated_on})

{evaluation}
Load it with `transformers.AutoModel*.from_pretrained(folder)` or `hf_posenc.from_pretrained(folder)`.
"""
    (Path(output_dir) / "README.md").write_text(card)


def corpus_name(spec: str) -> str:
    """A corpus as a card names it: a built-in or hub corpus as given, local files by their own name (no path)."""
    from .. import corpora

    paths = corpora.corpus_paths(spec)
    return ", ".join(sorted({p.name for p in paths})) if paths else spec


def objective_teacher(cfg) -> str:
    """What distill matched: the unpatched model, or the teacher train.teacher names (at the window's ids)."""
    if cfg.train.objective != "distill":
        return ""
    if cfg.train.teacher == "unpatched":
        return " (matching the unpatched model)"
    return f" (matching the loaded weights patched `{cfg.train.teacher}` to the patched context, at the window's ids)"
