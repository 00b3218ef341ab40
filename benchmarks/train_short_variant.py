"""A variant of an `hf-posenc extend` run's short stage, trained from the run's fine-tune into another folder: the
pipeline's own stage (its text, windows, lr, seed and warmup, as `extend.short_sections` plans them), with another
`train.short_long_share` (the share of the fine-tune's long windows drawn into it) or another number of steps. Judge
it beside the run's rows with `bench_extend_variants.py --rows NAME=FOLDER`.

The run is planned again from the same model and target with the variant's settings, and every other setting must
come out as the run's plan.json has it (the run's own flags, if any, after `--`; anything else is refused naming
it): the variant differs from the pipeline's stage only where asked. A killed variant resumes from its last checkpoint.

    OMP_NUM_THREADS=2 nice python benchmarks/train_short_variant.py --run runs/extend_smollm2_24576 --share 0.5 \\
        --out runs/variants24k/mixed30
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import common
from bench_extend_variants import check_model, run_settings
from hf_posenc.recipes import extend

VARIED = ("train.short_long_share", "train.short_steps")   # what a variant may change


def variant_plan(run: Path, model: str, share: float, steps: int | None, given: list[str]):
    """(plan, args): the run's plan again with the variant's settings, checked to differ from plan.json only in
    VARIED."""
    settings = run_settings(run)
    argv = ["--model", model, "--target", str(settings["target"]), "--output_dir", str(run), *given,
            "--train.short_long_share", format(share, "g"), *(["--train.short_steps", str(steps)] if steps else [])]
    args = extend.parse_args(argv)
    plan = extend.make_plan(args, extend.model_facts(args), extend.machine_kind(args.model.dtype))
    new = json.loads(json.dumps(plan.record()))
    old = {**extend.PLANNED_BEFORE, **settings}
    differ = [f"{k}: {old.get(k)} there, {new.get(k)} planned now" for k in sorted(set(old) | set(new))
              if k not in VARIED and old.get(k) != new.get(k)]
    if differ:
        common.refuse(f"--run {run} was planned with other settings than the model and target give now "
                      f"({'; '.join(differ)}): give the run's own flags after --")
    return plan, args


def check_out(out: Path, run: Path) -> None:
    """--out is new, empty, or this script's earlier variant of this run (it resumes or, killed before its first
    checkpoint, starts again): the stage would otherwise replace a folder it did not write."""
    if not out.exists() or (out.is_dir() and not any(out.iterdir())):
        return
    try:
        start = json.loads((out / "finetune_config.json").read_text())["model"]["name"]
    except (OSError, ValueError, KeyError, TypeError):
        start = None
    if start is None or Path(start).resolve() != (run / "finetune").resolve():
        common.refuse(f"--out {out} holds files other than a short-stage variant of {run}: give a new folder")


def main() -> None:
    parser = common.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", required=True, help="the output folder of `hf-posenc extend`, its fine-tune done")
    parser.add_argument("--model", default="smollm2", help="the run's base model (checked)")
    parser.add_argument("--share", type=float, required=True, help="train.short_long_share, in [0, 1)")
    parser.add_argument("--steps", type=common.count(1), help="train.short_steps (default: the plan's rule)")
    parser.add_argument("--out", required=True, help="the variant's folder (outside the run's)")
    parser.add_argument("given", nargs="*", help="after --: the flags the run was given besides --model, --target "
                                                 "and --output_dir (--tokens 4096, --train.corpus DIR, ...)")
    args = parser.parse_args()

    run, out = Path(args.run), Path(args.out)
    if not (run / "finetune" / "config.json").is_file():
        common.refuse(f"--run {run}: no finished fine-tune there (finetune/config.json): run the pipeline past it")
    check_model(run, args.model)
    if out.resolve().is_relative_to(run.resolve()):
        common.refuse(f"--out {out} is inside the run's folder: give a folder outside it")
    check_out(out, run)
    plan, planned = variant_plan(run, args.model, args.share, args.steps, args.given)
    print(f"short stage variant: {plan.value('train.short_steps')} steps, long share "
          f"{plan.value('train.short_long_share'):g}, from {run / 'finetune'} into {out}")
    extend.train_stage(planned.model, out, str(run / "finetune"), *extend.short_sections(plan), posenc=None)


if __name__ == "__main__":
    common.run(main)
