"""Fine-tune a patched model at its new context, on one CPU, one GPU or many (accelerate's engines).

    accelerate launch recipes/finetune.py --config recipes/configs/smollm2_yarn_16k_finetune.yaml
    accelerate launch -m hf_posenc.recipes.finetune --config smollm2_yarn_16k_finetune   # installed package
    hf-posenc finetune --config smollm2_yarn_16k_finetune     # one process, the same code
    accelerate launch --config_file recipes/accelerate/ddp.yaml recipes/finetune.py --config ... --train.lr 1e-4
    python recipes/finetune.py --config ... --resume          # continue from the latest checkpoint
    python recipes/finetune.py --help                         # every field and its default

The canonical accelerate loop: config -> checks -> Accelerator -> data under main_process_first ->
output folder -> model + patch -> prepare -> resume -> train under accumulate -> periodic save_state ->
final save on the main process. The pieces live beside it: its config (finetune_config.py, read by the
recipes' one config system, config.py), the checks before anything loads (finetune_checks.py), the model
and what trains (finetune_model.py); and in hf_posenc: the data (train_data.py), the checkpoints and the
loss log (checkpoints.py), the model card (card.py). A refused config ends as one `error: ...` line and
exit code 2, before anything is written.
"""

import copy
import json
import os
import sys
import time

# Before torch loads OpenMP: on a shared CPU, threads spinning at each barrier (the default) burn
# the time of the other processes; MiniLM healing took 6.5 s a step instead of 0.9 at load 5 on 2 cores.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch
from accelerate import Accelerator
from accelerate.utils import (DataLoaderConfiguration, DistributedDataParallelKwargs, GradientAccumulationPlugin,
                               set_seed)
from tqdm.auto import tqdm
from transformers import get_scheduler

import hf_posenc as hp
from hf_posenc import checkpoints as ckpt
from hf_posenc import data as hdata
from hf_posenc import train_data
from hf_posenc.card import fit_tokenizer, write_model_card
from hf_posenc.eval.similarity import embedding_cosine, held_out_passages
from hf_posenc.losses import TrainingLoss, output_logits_mismatch
from hf_posenc.recipes.config import one_line
from hf_posenc.recipes.finetune_checks import Plan, check_config, prepare_output_dir
from hf_posenc.recipes.finetune_config import Config, parse_config
from hf_posenc.recipes.finetune_model import (
    apply_lora,
    disable_dropout,
    load_model,
    load_tokenizer,
    mixed_precision,
    select_trainable,
)


def main(argv=None, prog=None):
    # 1. Config, and every check that can fail, before anything is loaded or written.
    cfg = parse_config(argv, prog)
    plan = check_config(cfg)
    RUN.update(output_dir=cfg.output_dir, steps=cfg.train.steps, step=None, bar=None, main=True)

    # 2. The Accelerator (process group, device, mixed precision, trackers).
    accelerator = Accelerator(
        cpu=torch.accelerator.current_accelerator() is None,   # CPU-only machine: gloo DDP under torchrun
        mixed_precision=mixed_precision(cfg.model.dtype),
        gradient_accumulation_plugin=GradientAccumulationPlugin(num_steps=cfg.train.grad_accum,
                                                                sync_with_dataloader=False),
        dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True),
        log_with=cfg.train.report_to, project_dir=cfg.output_dir,
        # routed experts: a step may leave an expert without a gradient, which DDP must look for every step
        # (other parameters the objective never reaches are frozen instead: freeze_unreached)
        kwargs_handlers=[DistributedDataParallelKwargs(find_unused_parameters=True)] if plan.routed_experts else None,
    )
    RUN["main"] = accelerator.is_main_process
    set_seed(cfg.train.seed)
    accelerator.print(run_summary(cfg, plan, accelerator.num_processes))

    # 3. Data: tokenized and packed once (main process first, cached on disk), then a DataLoader. Before
    #    the output folder is written and the weights load: a corpus of nothing is refused here.
    tokenizer = load_tokenizer(cfg)
    with accelerator.main_process_first():
        dataset = train_data.prepare_data(cfg.data, tokenizer, plan)
    pad_id = (tokenizer.pad_token_id if tokenizer.pad_token_id is not None
              else train_data.boundary_ids(tokenizer, False)[0])
    dataloader = torch.utils.data.DataLoader(dataset, batch_size=cfg.train.batch_size, shuffle=cfg.data.shuffle,
                                             collate_fn=train_data.collate(pad_id))
    if accelerator.is_main_process:
        prepare_output_dir(cfg)
        with open(f"{cfg.output_dir}/finetune_config.json", "w") as f:
            json.dump(cfg.to_dict(), f, indent=2)
    accelerator.wait_for_everyone()

    # 4. Model, the unpatched teacher (distill), the patch, what trains.
    model = load_model(cfg)
    teacher = None
    if cfg.train.objective == "distill":
        teacher = copy.deepcopy(model).eval().requires_grad_(False).to(accelerator.device)
        disable_dropout(model)
    if cfg.posenc:
        hp.patch(model, cfg.posenc["method"], **{k: v for k, v in cfg.posenc.items() if k != "method"})
    if cfg.model.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    select_trainable(model, cfg.train.trainable)
    if cfg.train.lora:
        model = apply_lora(model, cfg.train.lora, cfg.train.trainable)
    # The objective inside the module accelerate wraps: the loss, a block of logits at a time (train.loss_chunk)
    chunk = cfg.train.loss_chunk if plan.causal else 0
    why = chunk and output_logits_mismatch(model)
    if why:
        accelerator.print(f"warning: train.loss_chunk off for this model ({why}): the full logits are used")
        chunk = 0
    objective = TrainingLoss(model, objective=cfg.train.objective, causal=plan.causal, chunk=chunk,
                             temperature=cfg.train.temperature)
    if wraps_in_ddp(accelerator) and not plan.routed_experts:
        probe = train_data.collate(pad_id)([dataset[0]])
        unreached = freeze_unreached(objective, accelerator.device, probe, teacher)
        if unreached:
            accelerator.print(f"not trained: {len(unreached)} parameter(s) the {cfg.train.objective} objective never "
                              f"reaches ({', '.join(unreached[:4])}{', ...' if len(unreached) > 4 else ''}), frozen "
                              f"(DDP needs a gradient for every trained parameter; one process skips them alike)")
    n_train, n_total = select_trainable(model, "all")
    accelerator.print(f"{accelerator.distributed_type.value} on {accelerator.num_processes} processes; "
                      f"trainable parameters: {n_train:,} of {n_total:,}")

    # 5. Evaluation before training (optional).
    before = evaluate(model, tokenizer, cfg, plan, teacher) if accelerator.is_main_process else {}

    # 6. Optimizer (YaRN's AdamW defaults in the example configs), scheduler, prepare.
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=cfg.train.lr,
                                  betas=tuple(cfg.train.betas), eps=cfg.train.eps,
                                  weight_decay=cfg.train.weight_decay,
                                  fused=accelerator.device.type == "cpu")   # CPU: one kernel, not a loop over tensors
    scheduler = get_scheduler(cfg.train.scheduler, optimizer, num_warmup_steps=cfg.train.warmup_steps,
                              num_training_steps=cfg.train.steps)
    objective, optimizer, dataloader = accelerator.prepare(objective, optimizer, dataloader)
    accelerator.register_for_checkpointing(scheduler)   # stepped once per optimizer step, by hand below
    if cfg.train.report_to:
        accelerator.init_trackers("finetune", config=json.loads(json.dumps(cfg.to_dict(), default=str)))

    # 7. Resume: the newest complete checkpoint whose files are whole, then skip the micro-batches it had
    #    consumed. A broken one (a file truncated, a load that fails) is named and the one before it taken.
    start_step = 0
    if cfg.resume:
        start_step = resume(accelerator, cfg.output_dir)
    log = ckpt.LossLog(cfg.output_dir, start_step, accelerator.is_main_process)
    if start_step and start_step < cfg.train.steps:
        pace = ckpt.seconds_per_step(cfg.output_dir)
        if pace:
            accelerator.print(f"the {cfg.train.steps - start_step} steps left take about "
                              f"{duration(pace * (cfg.train.steps - start_step))} (the pace of the steps logged)")

    def micro_batches(consumed):
        epoch, skip = divmod(consumed, len(dataloader))
        while True:
            dataloader.set_epoch(epoch)
            yield from (accelerator.skip_first_batches(dataloader, skip) if skip else dataloader)
            epoch, skip = epoch + 1, 0

    batches = micro_batches(start_step * cfg.train.grad_accum)

    # 8. Train: grad_accum micro-batches per optimizer step, under accelerator.accumulate.
    objective.train()
    bar = tqdm(total=cfg.train.steps, initial=start_step, disable=not accelerator.is_local_main_process,
               desc="finetune")
    RUN.update(bar=bar, step=start_step)
    for step in range(start_step + 1, cfg.train.steps + 1):
        started, losses, tokens = time.perf_counter(), [], 0
        for micro in range(cfg.train.grad_accum):
            batch = next(batches)
            torch.manual_seed(ckpt.step_seed(cfg.train.seed, step, micro))   # dropout: the same draws after a resume
            positions = window_positions(plan, batch, cfg, accelerator, step, micro)
            with accelerator.accumulate(objective):
                loss = objective(batch["input_ids"], batch["attention_mask"], teacher=teacher, position_ids=positions)
                accelerator.backward(loss)
                losses.append(loss.detach())
                if accelerator.sync_gradients:
                    stop_if_diverged(accelerator, losses, step, cfg, bar)   # before a NaN reaches the weights
                    if cfg.train.max_grad_norm:
                        accelerator.clip_grad_norm_(objective.parameters(), cfg.train.max_grad_norm)
                optimizer.step()
                optimizer.zero_grad()
            tokens += int(batch["attention_mask"].sum())
        scheduler.step()
        step_loss = accelerator.reduce(torch.stack(losses).mean(), reduction="mean").item()
        tokens = int(accelerator.reduce(torch.tensor(tokens, device=accelerator.device), reduction="sum"))
        record = {"step": step, "loss": step_loss, "tokens": tokens, "lr": scheduler.get_last_lr()[0],
                  "tokens_per_s": tokens / (time.perf_counter() - started), "peak_mem_mb": ckpt.peak_memory_mb()}
        if cfg.eval.every and step % cfg.eval.every == 0 and accelerator.is_main_process:
            record.update(evaluate(model, tokenizer, cfg, plan, teacher))
        log.write(record)
        if cfg.train.report_to:
            accelerator.log({k: v for k, v in record.items() if k != "step"}, step=step)
        bar.set_postfix(loss=f"{step_loss:.4f}", lr=f"{record['lr']:.2e}", tok_s=f"{record['tokens_per_s']:.0f}",
                        mem=f"{record['peak_mem_mb']:.0f}MB")
        bar.update()
        RUN["step"] = step
        if step == start_step + 1 and step < cfg.train.steps:   # the first step of this run: how long the rest takes
            took = time.perf_counter() - started
            accelerator.print(f"step {step} took {duration(took)}: the {cfg.train.steps - step} steps left take about "
                              f"{duration(took * (cfg.train.steps - step))}")

        # 9. Periodic checkpoint (the full state: model, optimizer, scheduler, RNGs, sampler).
        if step % cfg.train.save_every == 0 or step == cfg.train.steps:
            folder = ckpt.checkpoint_dir(cfg.output_dir, step)
            if accelerator.is_main_process and folder.exists():
                ckpt.begin_checkpoint(folder)
            accelerator.save_state(str(folder))
            accelerator.wait_for_everyone()   # every process' RNG file is written before the manifest
            if accelerator.is_main_process:
                ckpt.mark_done(folder)
                ckpt.prune_checkpoints(cfg.output_dir, cfg.train.keep_checkpoints)
        if cfg.train.stop_after_steps and step >= cfg.train.stop_after_steps and step < cfg.train.steps:
            bar.close()
            accelerator.print(f"stopped after step {step} (train.stop_after_steps); continue with --resume")
            accelerator.end_training()
            return None
    bar.close()

    # 10. Final model, saved the hf_posenc way (stock-loadable config), tokenizer, evaluation, model card.
    accelerator.wait_for_everyone()
    unwrapped = accelerator.unwrap_model(objective).model
    if cfg.train.lora:
        final, state_dict = unwrapped.merge_and_unload(), None
    else:   # the wrapper's state dict, its "model." prefix off
        state_dict = accelerator.get_state_dict(objective)
        final, state_dict = unwrapped, state_dict and {k.removeprefix("model."): v for k, v in state_dict.items()}
    if accelerator.is_main_process:
        final.save_pretrained(cfg.output_dir, state_dict=state_dict)
        fit_tokenizer(tokenizer, final)   # model_max_length: the patched context, which tools truncate to
        tokenizer.save_pretrained(cfg.output_dir)
        after = evaluate(final, tokenizer, cfg, plan, teacher)
        for name, figures in (("eval_before.json", before), ("eval_after.json", after)):
            if figures:
                open(f"{cfg.output_dir}/{name}", "w").write(json.dumps(figures, indent=2))
        describe = hp.describe(final) if cfg.posenc else {}
        tokens_seen = sum(r["tokens"] for r in ckpt.read_log(cfg.output_dir))
        write_model_card(cfg.output_dir, cfg, plan, describe, cfg.train.steps, tokens_seen, before, after)
        accelerator.print(f"saved to {cfg.output_dir}" + (f"; eval before {before}, after {after}" if after else ""))
    accelerator.end_training()
    return final


def run_summary(cfg: Config, plan: Plan, processes: int) -> str:
    """What the run is about to do, printed before anything loads: the model, the patch, the objective, the
    steps and tokens, the output folder, and when a time can be told (after the first step, or at once when
    resuming a run whose steps are logged)."""
    patch = ("no posenc patch" if not cfg.posenc else "posenc " + " ".join(
        [cfg.posenc["method"], *(f"{k}={v}" for k, v in cfg.posenc.items() if k != "method")]))
    context = (f"{plan.original_context} -> {plan.target_context} positions" if plan.target_context != plan.original_context
               else f"{plan.target_context} positions")
    trains = "LoRA adapters" if cfg.train.lora else ("all weights" if cfg.train.trainable == "all"
                                                     else f"trainable {cfg.train.trainable}")
    if cfg.train.lora and cfg.train.trainable != "all":
        trains += f" + {cfg.train.trainable}"
    sequences = cfg.train.batch_size * cfg.train.grad_accum * processes
    per_step = sequences * plan.seq_len
    shares = f", {cfg.data.short_share:.0%} of them cut to {plan.short_len}" if plan.short_len else ""
    positions = f", position ids {cfg.train.positions}" if plan.positions.spreads else ""
    lines = [f"fine-tune {cfg.model.name}: {patch} ({context}), objective {cfg.train.objective}, {trains}{positions}",
             f"  {cfg.train.steps} steps x {sequences} sequences of {plan.seq_len} tokens{shares} (batch_size "
             f"{cfg.train.batch_size} x grad_accum {cfg.train.grad_accum} x {processes} process"
             f"{'es' if processes > 1 else ''}) = up to {per_step:,} tokens a step, {per_step * cfg.train.steps:,} in all",
             f"  output: {cfg.output_dir}" + (" (resuming its run)" if cfg.resume else "")
             + f"; checkpoints every {cfg.train.save_every} steps",
             "  time: said after the first step" + (" (or at once from the steps logged, when resuming)"
                                                      if cfg.resume else "")]
    return "\n".join(lines)


def duration(seconds: float) -> str:
    """12 s, 3 min 20 s, 2 h 05 min."""
    seconds = round(seconds)
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60:02d} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60:02d} min"


def wraps_in_ddp(accelerator) -> bool:
    """Whether `accelerator.prepare` wraps the model in DistributedDataParallel (several processes, no
    FSDP / DeepSpeed): DDP then needs every trainable parameter to receive a gradient at every step."""
    from accelerate.utils import DistributedType

    return accelerator.multi_device or accelerator.distributed_type == DistributedType.MULTI_CPU


def freeze_unreached(objective: torch.nn.Module, device, probe: dict, teacher=None, tokens: int = 16) -> list[str]:
    """Freeze the trainable parameters the objective's loss never depends on (an encoder's pooler under
    distill, which matches hidden states; a head the loss does not use), found by one forward and backward
    on the first `tokens` tokens of a training block; returns their names. Nothing changes in what trains:
    AdamW and gradient clipping skip a parameter without a gradient, so one process leaves them as they are,
    and frozen, DDP leaves them too instead of stopping at the second step ("Parameter indices which did
    not receive grad"). The RNG state (dropout) is restored and the gradients cleared afterwards.
    Models whose use of parameters depends on the data (routed experts) are not probed: DDP looks for
    unused parameters at every step there (Plan.routed_experts)."""
    objective.to(device)
    ids, mask = (probe[k][:, :tokens].to(device) for k in ("input_ids", "attention_mask"))
    trainable = [(n, p) for n, p in objective.named_parameters() if p.requires_grad]
    with torch.random.fork_rng(devices=[]):
        objective(ids, mask, teacher=teacher).backward()
    unreached = [n.removeprefix("model.") for n, p in trainable if p.grad is None]
    for n, p in trainable:
        if p.grad is None:
            p.requires_grad_(False)
        p.grad = None
    return unreached


def window_positions(plan: Plan, batch: dict, cfg: Config, accelerator, step: int, micro: int):
    """The position ids train.positions gives this micro-batch (None: contiguous, the model's own 0..n-1).
    Row r of micro-batch `micro` of optimizer step `step` on process p is window number
    ((((step - 1) * grad_accum + micro) * processes + p) * batch_size + r) of the run, and its ids depend
    only on (seed, that number): a resumed run draws the same ids, each process those of its own windows."""
    if not plan.positions.spreads:
        return None
    consumed = (step - 1) * cfg.train.grad_accum + micro
    first = (consumed * accelerator.num_processes + accelerator.process_index) * cfg.train.batch_size
    return plan.positions.batch_position_ids(batch["attention_mask"], seed=cfg.train.seed, first_index=first,
                                             window=plan.seq_len)


@torch.no_grad()
def evaluate(model, tokenizer, cfg: Config, plan: Plan, teacher=None) -> dict:
    """Causal LMs: perplexity of the held-out documents at each of eval.lengths (`hf_posenc.eval`).
    Encoders: mean cosine of mean-pooled embeddings to the unpatched model on held-out passages
    (cosine@length) and on the short probe sentences of hf_posenc.assets (cosine_probe)."""
    if not cfg.eval.lengths:
        return {}
    was_training = model.training
    model.eval()
    docs = train_data.load_documents(cfg.data, cfg.eval.corpus)
    results = {}
    try:
        if plan.causal:
            from hf_posenc import eval as hpe

            ids = hdata.tokenize(docs, tokenizer)["input_ids"]
            for length in cfg.eval.lengths:
                chosen = [d[:length] for d in ids if len(d) >= length][:cfg.eval.documents]
                if chosen:
                    results[f"perplexity@{length}"] = hpe.document_perplexity(
                        model, chosen, max_length=length, progress=False)["perplexity"]
        elif teacher is not None:
            from hf_posenc.assets import PROBE_SENTENCES

            passages = held_out_passages(docs["text"], cfg.eval.documents * 8)
            for length in cfg.eval.lengths:
                results[f"cosine@{length}"] = embedding_cosine(model, teacher, tokenizer, passages, length)
            results["cosine_probe"] = embedding_cosine(model, teacher, tokenizer, list(PROBE_SENTENCES),
                                                       max(cfg.eval.lengths))
    finally:
        model.train(was_training)
    return results


def resume(accelerator, output_dir) -> int:
    """Load the newest checkpoint that is whole; returns its step (0: none, start from the beginning). A
    newer one left half-written (the run stopped while saving it: no `done` mark) is named."""
    incomplete = ckpt.incomplete_checkpoints(output_dir)
    for path in reversed(ckpt.complete_checkpoints(output_dir)):
        step = int(path.name.split("_")[1])
        problem = ckpt.checkpoint_problem(path)
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


class TrainingDiverged(hp.PosEncError, ValueError):
    """The loss became NaN or inf: the run stops, its last checkpoint is kept."""


def stop_if_diverged(accelerator, losses, step, cfg, bar) -> None:
    """Stop, before the optimizer applies it, at the first non-finite loss on any process."""
    bad = torch.tensor(float(not torch.isfinite(torch.stack(losses)).all()), device=accelerator.device)
    if accelerator.reduce(bad, reduction="sum").item():
        bar.close()   # its line ends before the error's
        saved = ckpt.latest_checkpoint(cfg.output_dir)[0]
        raise TrainingDiverged(
            f"the loss became NaN or inf at step {step}; check train.lr ({cfg.train.lr}), model.dtype "
            f"({cfg.model.dtype}; float16 overflows easily) and the data ({cfg.data.corpus}); "
            + (f"the last good checkpoint is {saved}" if saved else "no checkpoint was saved before it"))


# What a refusal from the checks can raise: one `error: ...` line and exit code 2, no traceback.
REFUSALS = (hp.PosEncError, OSError)

# Where the run is, for the line an interruption prints: output_dir, steps, the last finished step (None:
# training has not started), the progress bar, and whether this is the main process.
RUN: dict = {}


def interrupted_line(run: dict) -> str:
    """One line: what an interrupted run saved, and how to continue it."""
    if not run.get("output_dir"):
        return "interrupted before the run started: nothing was written"
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
    """The command line (`prog`: the command `usage:` names, default as this process started). Ctrl-C (and,
    in a launched process, the launcher's SIGTERM) ends it with one line saying what was saved and how to
    resume, exit code 130, on the main process only."""
    import signal

    RUN.clear()
    previous = signal.signal(signal.SIGTERM, _interrupt) if _launched() else None
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
            signal.signal(signal.SIGTERM, previous)
    return 0


def _launched() -> bool:
    """Started by torchrun / accelerate launch (which stop their processes with SIGTERM)."""
    import threading

    return "LOCAL_RANK" in os.environ and threading.current_thread() is threading.main_thread()


def _interrupt(signum, frame):
    raise KeyboardInterrupt


if __name__ == "__main__":
    sys.exit(cli())
