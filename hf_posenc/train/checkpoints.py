"""A fine-tuning run's checkpoints and its loss log: where each checkpoint goes, when it is complete (a
manifest of its file sizes, then a `done` mark), which ones to keep, the seed of each micro-batch (so a
resumed run draws what the uninterrupted one drew), log.jsonl, one line per optimizer step, and the stop at the
first loss that is NaN or inf, naming the last good checkpoint."""

from __future__ import annotations

import hashlib
import json
import resource
import shutil
import sys
from pathlib import Path
from typing import Optional

import torch

from ..errors import PosEncError, one_line


def checkpoint_dir(output_dir: str, step: int) -> Path:
    return Path(output_dir) / "checkpoints" / f"step_{step:07d}"


def latest_checkpoint(output_dir: str) -> tuple[Optional[Path], int]:
    folders = complete_checkpoints(output_dir)
    return (folders[-1], int(folders[-1].name.split("_")[1])) if folders else (None, 0)


def complete_checkpoints(output_dir: str) -> list[Path]:
    """The checkpoints marked done, oldest first (a checkpoint cut short by a kill has no `done`)."""
    folders = sorted((Path(output_dir) / "checkpoints").glob("step_*"))
    return [f for f in folders if (f / "done").exists()]


def incomplete_checkpoints(output_dir: str) -> list[int]:
    """The steps of checkpoint folders without a `done` mark (a save cut short by a kill or a Ctrl-C)."""
    folders = sorted((Path(output_dir) / "checkpoints").glob("step_*"))
    return [int(f.name.split("_")[1]) for f in folders if f.is_dir() and not (f / "done").exists()]


MANIFEST = "manifest.json"


def begin_checkpoint(folder: Path) -> None:
    """Before writing into a checkpoint folder (again, after a fallback): it is not done until `mark_done`."""
    (folder / "done").unlink(missing_ok=True)


def mark_done(folder: Path) -> None:
    """Record each file's size, then mark the checkpoint complete: a file truncated later (a full disk, a
    copy cut short) is found by its size before anything is loaded from it."""
    files = {p.relative_to(folder).as_posix(): p.stat().st_size
             for p in sorted(folder.rglob("*")) if p.is_file() and p.name not in ("done", MANIFEST)}
    (folder / MANIFEST).write_text(json.dumps({"sizes": files}, indent=1))
    (folder / "done").touch()


def checkpoint_problem(folder: Path) -> Optional[str]:
    """What is wrong with a complete checkpoint's files, or None (also for one saved before manifests)."""
    manifest = folder / MANIFEST
    if not manifest.exists():
        return None
    try:
        sizes = json.loads(manifest.read_text())["sizes"]
    except (ValueError, KeyError, TypeError):
        return f"{manifest} is unreadable"
    for name, size in sizes.items():
        path = folder / name
        if not path.is_file():
            return f"{path} is missing"
        if path.stat().st_size != size:
            return f"{path} has {path.stat().st_size} bytes, {size} when it was saved (truncated or replaced)"
    return None


def step_seed(seed: int, step: int, micro_batch: int) -> int:
    """The RNG seed (dropout) of one micro-batch: a function of where it is in the run alone, so a resumed
    run draws what the uninterrupted one drew. Restoring the RNG state saved with the checkpoint is not
    enough: the resumed run's new DataLoader iterator takes one draw from the global generator (its base
    seed) that the uninterrupted run took at the start of the epoch instead."""
    return int.from_bytes(hashlib.sha256(f"{seed}:{step}:{micro_batch}".encode()).digest()[:8], "little") >> 1


def prune_checkpoints(output_dir: str, keep: int) -> None:
    folders = sorted((Path(output_dir) / "checkpoints").glob("step_*"))
    for folder in folders[:-keep] if keep > 0 else []:
        shutil.rmtree(folder, ignore_errors=True)


class LossLog:
    """log.jsonl in the output folder, one line per optimizer step; on resume, the lines after the
    checkpoint's step are dropped (those steps run again)."""

    def __init__(self, output_dir: str, resume_step: int, enabled: bool):
        self.path, self.enabled = Path(output_dir) / "log.jsonl", enabled
        if enabled and self.path.exists():
            kept = [line for line in self.path.read_text().splitlines()
                    if line.strip() and json.loads(line)["step"] <= resume_step]
            self.path.write_text("".join(line + "\n" for line in kept))

    def write(self, record: dict) -> None:
        if self.enabled:
            with self.path.open("a") as f:
                f.write(json.dumps(record) + "\n")


def seconds_per_step(output_dir: str) -> float | None:
    """The median time of a logged step (from its tokens and tokens/s), or None when none is logged."""
    times = sorted(r["tokens"] / r["tokens_per_s"] for r in read_log(output_dir) if r.get("tokens_per_s"))
    return times[len(times) // 2] if times else None


def read_log(output_dir: str) -> list[dict]:
    path = Path(output_dir) / "log.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def peak_memory_mb() -> float:
    if torch.cuda.is_available():
        return torch.cuda.max_memory_allocated() / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024   # Linux: KiB


def resume(accelerator, output_dir) -> int:
    """Load into `accelerator` (its model, optimizer, scheduler and random states) the newest checkpoint that is
    whole; returns its step (0: none, start from the beginning). A newer one left half-written (the run stopped
    while saving it: no `done` mark) is named; a broken one is said and the one before it tried."""
    incomplete = incomplete_checkpoints(output_dir)
    for path in reversed(complete_checkpoints(output_dir)):
        step = int(path.name.split("_")[1])
        problem = checkpoint_problem(path)
        if problem is None:
            try:
                accelerator.load_state(str(path))
            except Exception as err:   # a file damaged in place: say which checkpoint, try the one before
                problem = f"{path} cannot be loaded ({type(err).__name__}: {one_line(err)[:300]})"
        if problem is None:
            skipped = [n for n in incomplete if n > step]
            if skipped:
                accelerator.print(f"step {', '.join(map(str, skipped))} incomplete (the run stopped while saving "
                                  f"it), resuming from step {step}")
            accelerator.print(f"resumed from {path} (step {step})")
            return step
        message = f"warning: checkpoint step {step} is broken: {problem}; falling back to the checkpoint before it"
        accelerator.print(message)
        print(message, file=sys.stderr)
    if incomplete:
        accelerator.print(f"step {', '.join(map(str, incomplete))} incomplete (the run stopped while saving it), "
                          f"resuming from step 0")
    accelerator.print(f"no complete checkpoint in {output_dir}/checkpoints: starting from step 0")
    return 0


class TrainingDiverged(PosEncError, ValueError):
    """The loss became NaN or inf: the run stops, its last checkpoint is kept."""


def stop_if_diverged(accelerator, losses, step, cfg, bar) -> None:
    """Stop, before the optimizer applies it, at the first non-finite loss on any process."""
    bad = torch.tensor(float(not torch.isfinite(torch.stack(losses)).all()), device=accelerator.device)
    if accelerator.reduce(bad, reduction="sum").item():
        if bar is not None:
            bar.close()   # its line ends before the error's
        saved = latest_checkpoint(cfg.output_dir)[0]
        raise TrainingDiverged(
            f"the loss became NaN or inf at step {step}; check train.lr ({cfg.train.lr}), model.dtype "
            f"({cfg.model.dtype}; float16 overflows easily) and the data ({cfg.data.corpus}); "
            + (f"the last good checkpoint is {saved}" if saved else "no checkpoint was saved before it"))
