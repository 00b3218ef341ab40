"""Fine-tune a patched model at its new context, on one CPU, one GPU or many (accelerate's engines).

    accelerate launch recipes/finetune.py --config recipes/configs/smollm2_yarn_16k_finetune.yaml
    accelerate launch -m hf_posenc.recipes.finetune --config smollm2_yarn_16k_finetune   # installed package
    hf-posenc finetune --config smollm2_yarn_16k_finetune     # one process, the same code
    accelerate launch --config_file recipes/accelerate/ddp.yaml recipes/finetune.py --config ... --train.lr 1e-4
    python recipes/finetune.py --config ... --resume          # continue from the latest checkpoint
    python recipes/finetune.py --help                         # every field and its default

This module is the command line: the config parsed (finetune_config.py), then the run, a FinetuneRecipe
(finetune_recipe.py: setup, train_step, evaluate, save_checkpoint, resume, each a method). A refused config
ends as one `error: ...` line and exit code 2, before anything is written; Ctrl-C as one line saying what
was saved. torch loads only once the config is read: `--help` answers without it.
"""

import os
import sys

# Before torch loads OpenMP (parsing the config may load it: the position schemes): on a shared CPU, threads
# spinning at each barrier (the default) burn the time of the other processes; MiniLM healing took 6.5 s a
# step instead of 0.9 at load 5 on 2 cores.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from hf_posenc.errors import PosEncError  # noqa: E402
from hf_posenc.recipes.finetune_config import parse_config  # noqa: E402
from hf_posenc.errors import one_line  # noqa: E402


def main(argv=None, prog=None):
    """One run: the config, every check (before anything loads or is written), setup, training. Returns the
    final model (None when train.stop_after_steps stopped the run)."""
    cfg = parse_config(argv, prog)
    from hf_posenc.recipes.finetune_recipe import FinetuneRecipe

    recipe = FinetuneRecipe(cfg, progress=RUN)
    recipe.setup()
    return recipe.train()


# What a refusal from the checks can raise: one `error: ...` line and exit code 2, no traceback.
REFUSALS = (PosEncError, OSError)

# Where the run is, for the line an interruption prints: output_dir, steps, the last finished step (None:
# training has not started), the progress bar, and whether this is the main process.
RUN: dict = {}


def interrupted_line(run: dict) -> str:
    """One line: what an interrupted run saved, and how to continue it."""
    if not run.get("output_dir"):
        return "interrupted before the run started: nothing was written"
    from hf_posenc.train import checkpoints as ckpt

    out, step = run["output_dir"], run.get("step")
    saved, saved_step = ckpt.latest_checkpoint(out)
    where = ("before training started" if step is None
             else f"after step {step} of {run['steps']}" if step else f"during step 1 of {run['steps']}")
    if saved is None:
        return (f"interrupted {where}: no checkpoint saved yet in {out}/checkpoints; run the same command with "
                f"--overwrite_output_dir to start again")
    return (f"interrupted {where}: the last checkpoint is step {saved_step} ({saved}); continue with the same "
            f"command and --resume")


def cli(argv=None, prog=None) -> int:
    """The command line (`prog`: the command `usage:` names, default as this process started). Ctrl-C and
    SIGTERM (`kill`, a job scheduler's stop, a launcher stopping its processes) end it alike: one line saying
    what was saved and how to resume, exit code 130, on the main process only."""
    import signal

    RUN.clear()
    handlers = _main_thread()   # signal handlers can only be set there (a test may call this from a thread)
    previous = (signal.signal(signal.SIGTERM, _interrupt), signal.getsignal(signal.SIGINT)) if handlers else None
    try:
        main(argv, prog)
    except REFUSALS as err:
        print(f"error: {one_line(err)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        signal.signal(signal.SIGINT, signal.SIG_IGN)   # a second Ctrl-C (or the launcher's SIGTERM) adds nothing
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        if RUN.get("bar") is not None:
            RUN["bar"].close()
        if RUN.get("main", True):
            print(f"\n{interrupted_line(RUN)}", file=sys.stderr)
        return 130
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous[0])
            signal.signal(signal.SIGINT, previous[1])
    return 0


def _main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


def _interrupt(signum, frame):
    raise KeyboardInterrupt


if __name__ == "__main__":
    sys.exit(cli())
