"""The fine-tune recipe as a class (as torchtune writes its recipes): each phase of a run is a method that a
test can call alone on a tiny model.

    recipe = FinetuneRecipe(cfg)     # every check (finetune_checks): refused before anything loads or is written
    recipe.setup()                   # setup_accelerator, setup_data, setup_model, evaluate (before), setup_optimizer
    final = recipe.train()           # resume, then train_step / save_checkpoint per step, save_final, cleanup

The phases are a state machine: setup -> resume -> train_step / train -> save_final -> cleanup, each once,
train_step(n) only for the next step and save_checkpoint(n) only for the step last taken; a phase called out of
order raises PhaseOrderError naming the order (a resumed run is then the straight run, bit for bit).

The canonical accelerate loop: Accelerator -> data under main_process_first -> output folder -> model +
patch -> prepare -> resume -> train under accumulate -> periodic save_state -> final save on the main
process. The command line (parsing, a refusal's one line, Ctrl-C) is finetune.py; the pieces live beside
it: the config (finetune_config.py), the checks (finetune_checks.py, and finetune_long.py for the long-context
options), the model card (finetune_card.py); and in hf_posenc/train/ what any training loop could use: the data
(data.py), what trains (trainable.py), the teacher (teacher.py), the attention and precision the hardware runs
(hardware.py), the checkpoints, the loss log and a diverged loss (checkpoints.py).
"""

from __future__ import annotations

import json
import os
import time
from typing import Iterator, Optional

# Before torch loads OpenMP: on a shared CPU, threads spinning at each barrier (the default) burn
# the time of the other processes; MiniLM healing took 6.5 s a step instead of 0.9 at load 5 on 2 cores.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402
from accelerate import Accelerator  # noqa: E402
from accelerate.utils import (DataLoaderConfiguration, DistributedDataParallelKwargs,  # noqa: E402
                              GradientAccumulationPlugin, set_seed)
from tqdm.auto import tqdm  # noqa: E402
from transformers import get_scheduler  # noqa: E402

import hf_posenc as hp  # noqa: E402
from hf_posenc.train import checkpoints as ckpt  # noqa: E402
from hf_posenc import corpora  # noqa: E402
from hf_posenc.train import documents  # noqa: E402
from hf_posenc.train import mixed_windows  # noqa: E402
from hf_posenc.train import data as train_data  # noqa: E402
from hf_posenc.recipes.patch_card import carried_rope, fit_tokenizer  # noqa: E402
from hf_posenc.recipes.finetune_card import write_model_card  # noqa: E402
from hf_posenc.eval.similarity import embedding_cosine, held_out_passages  # noqa: E402
from hf_posenc.causal_lm import output_logits_mismatch  # noqa: E402
from hf_posenc.train.losses import TrainingLoss  # noqa: E402
from hf_posenc.train import teacher as train_teacher  # noqa: E402
from hf_posenc.recipes.finetune_checks import Preflight, check_config, check_engine, prepare_output_dir  # noqa: E402
from hf_posenc.recipes.finetune_config import FinetuneConfig  # noqa: E402
from hf_posenc.recipes.finetune_long import unused_settings  # noqa: E402
from hf_posenc import loading  # noqa: E402
from hf_posenc.assets import resolve_alias  # noqa: E402
from hf_posenc.errors import ConfigError, ParameterTypeError, one_line  # noqa: E402
from hf_posenc.train import s2_attention  # noqa: E402
from hf_posenc.train.checkpoints import stop_if_diverged  # noqa: E402
from hf_posenc.train.hardware import choose_attention, mixed_precision  # noqa: E402
from hf_posenc.train.trainable import apply_lora, disable_dropout, freeze_unreached, select_trainable  # noqa: E402


class FinetuneRecipe:
    """One fine-tuning run of `cfg`. The constructor runs every check (`check_config`, or takes the
    `preflight` a caller already has); `progress` is a dict the run keeps current (output_dir, steps, the
    last finished step, the progress bar, whether this is the main process) for the line an interrupted
    run prints (finetune.py)."""

    def __init__(self, cfg: FinetuneConfig, preflight: Optional[Preflight] = None, progress: Optional[dict] = None):
        if not isinstance(cfg, FinetuneConfig):   # None or a dict would end in an AttributeError deep in the checks
            raise ParameterTypeError(f"FinetuneRecipe needs a FinetuneConfig (finetune_config.parse_config(argv), or "
                                     f"FinetuneConfig(...)), got {type(cfg).__name__}: {cfg!r:.60}")
        self.cfg = cfg
        self.preflight = check_config(cfg) if preflight is None else preflight
        self.progress = {} if progress is None else progress
        self.progress.update(output_dir=cfg.output_dir, steps=cfg.train.steps, step=None, bar=None, main=True)
        self.teacher = None
        self.before: dict = {}
        self.start_step = 0   # where this run started (resume)
        self.step = 0         # the last step taken
        self.batches: Optional[Iterator[dict]] = None   # set by resume()
        self.phase = "new"    # the last phase done, one of PHASES

    def _expect(self, call: str, *phases: str) -> None:
        """Refuse `call` unless the last phase done is one of `phases`."""
        if self.phase not in phases:
            raise PhaseOrderError(f"FinetuneRecipe.{call} cannot run {AFTER[self.phase]}: the phases run in the "
                                  f"order {ORDER}, each once")

    # ------------------------------------------------------------------------------------------- setup
    def setup(self) -> None:
        """Everything before the first step, in the order a run needs it: the data before the output
        folder is written and the weights load (a corpus of nothing is refused first), the evaluation
        before training on the model as patched, the optimizer last (a patch may add parameters)."""
        self._expect("setup()", "new")
        self.setup_accelerator()
        self.setup_data()
        self.setup_model()
        self.before = self.evaluate() if self.accelerator.is_main_process else {}
        self.setup_optimizer()

    def setup_accelerator(self) -> None:
        """The Accelerator (process group, device, mixed precision, trackers), the seed, and the summary of
        what the run is about to do."""
        self._expect("setup_accelerator()", "new")
        cfg, preflight = self.cfg, self.preflight
        # fsdp.yaml or flex_attention on CPUs: refused before anything is written
        check_engine(cpu=torch.accelerator.current_accelerator() is None,
                     attn_implementation=cfg.model.attn_implementation)
        self.accelerator = Accelerator(
            cpu=torch.accelerator.current_accelerator() is None,   # CPU-only machine: gloo DDP under torchrun
            mixed_precision=mixed_precision(cfg.model.dtype),
            gradient_accumulation_plugin=GradientAccumulationPlugin(num_steps=cfg.train.grad_accum,
                                                                    sync_with_dataloader=False),
            dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True),
            log_with=cfg.train.report_to, project_dir=cfg.output_dir,
            # routed experts: a step may leave an expert without a gradient, which DDP must look for every step
            # (other parameters the objective never reaches are frozen instead: freeze_unreached)
            kwargs_handlers=([DistributedDataParallelKwargs(find_unused_parameters=True)]
                             if preflight.routed_experts else None),
        )
        self.progress["main"] = self.accelerator.is_main_process
        set_seed(cfg.train.seed)
        self.accelerator.print(run_summary(cfg, preflight, self.accelerator.num_processes))
        self.phase = "accelerator"

    def setup_data(self) -> None:
        """The tokenizer; the data tokenized and packed once (main process first, cached on disk) and its
        DataLoader; then the output folder with the run's config."""
        self._expect("setup_data()", "accelerator")
        cfg, accelerator = self.cfg, self.accelerator
        self.tokenizer = load_tokenizer(cfg)
        with accelerator.main_process_first():
            self.dataset = train_data.prepare_data(cfg.data, self.tokenizer, self.preflight)
        tokenizer = self.tokenizer
        self.pad_id = (tokenizer.pad_token_id if tokenizer.pad_token_id is not None
                       else train_data.boundary_ids(tokenizer, False)[0])
        documents_eos = train_data.boundary_ids(tokenizer, False)[0] if cfg.data.packing == "documents" else None
        self.dataloader = torch.utils.data.DataLoader(self.dataset, batch_size=cfg.train.batch_size,
                                                      shuffle=cfg.data.shuffle,
                                                      collate_fn=train_data.collate(
                                                          self.pad_id, documents_eos,
                                                          document_numbers=self.preflight.positions.spreads))
        if accelerator.is_main_process:
            prepare_output_dir(cfg)
            # whole or not at all: a later --resume compares its settings with this file (check_resume)
            saved = f"{cfg.output_dir}/finetune_config.json"
            with open(f"{saved}.tmp", "w") as f:
                json.dump(cfg.to_dict(), f, indent=2)
            os.replace(f"{saved}.tmp", saved)
        accelerator.wait_for_everyone()
        self.phase = "data"

    def setup_model(self) -> None:
        """The model, the unpatched teacher (distill), the patch, what trains, and the objective inside the
        module accelerate wraps: the loss, a block of logits at a time (train.loss_chunk)."""
        self._expect("setup_model()", "data")
        accelerator = self.accelerator
        self.model = self._patched_model()
        self.objective = self._objective(self.model)
        n_train, n_total = select_trainable(self.model, "all")
        processes = (f"{accelerator.distributed_type.value} on {accelerator.num_processes} processes"
                     if accelerator.num_processes > 1 else f"1 process on {accelerator.device}")
        accelerator.print(f"{processes}; trainable parameters: {n_train:,} of {n_total:,}")
        self.phase = "model"

    def _patched_model(self) -> torch.nn.Module:
        """The model loaded (the teacher taken from its weights first), patched, with what trains selected (LoRA
        adapters added) and S2-Attn on for training."""
        cfg, preflight = self.cfg, self.preflight
        model = load_model(cfg)
        if cfg.train.objective == "distill":   # before the student's patch: the loaded weights
            self.teacher = train_teacher.build(model, cfg.train.teacher, preflight.target_context,
                                               self.accelerator.device)
            disable_dropout(model)
        long = preflight.long_training
        if long.switched:   # mixed windows: the patch as the rope that switches with the window's length
            hp.patch(model, "longrope", **long.switched)
        elif cfg.posenc:
            hp.patch(model, cfg.posenc["method"], **{k: v for k, v in cfg.posenc.items() if k != "method"})
        if long.document_mask:   # SDPA without sliding windows: a call per document, no n x n mask
            documents.use_per_document(model)
        if cfg.model.gradient_checkpointing:
            model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
        select_trainable(model, cfg.train.trainable)
        if cfg.train.lora:
            model = apply_lora(model, cfg.train.lora, cfg.train.trainable)
        if long.s2_group:   # train.attention=s2: grouped in training mode only
            s2_attention.enable(model, long.s2_group, long.s2_shift)
        return model

    def _objective(self, model: torch.nn.Module) -> TrainingLoss:
        """The training loss around `model` (what accelerate wraps); under DDP, the parameters it never reaches
        frozen."""
        cfg, preflight, accelerator = self.cfg, self.preflight, self.accelerator
        chunk = cfg.train.loss_chunk if preflight.causal else 0
        why = chunk and output_logits_mismatch(model)
        if why:
            accelerator.print(f"warning: train.loss_chunk off for this model ({why}): the full logits are used")
            chunk = 0
        long = preflight.long_training
        objective = TrainingLoss(model, objective=cfg.train.objective, causal=preflight.causal, chunk=chunk,
                                 temperature=cfg.train.temperature, loss=long.loss,
                                 documents=bool(long.document_mask),
                                 teacher_reads_ids=train_teacher.reads_position_ids(cfg.train.teacher))
        if wraps_in_ddp(accelerator) and not preflight.routed_experts:
            probe = train_data.collate(self.pad_id)([self.dataset[0]])
            unreached = freeze_unreached(objective, accelerator.device, probe, self.teacher)
            if unreached:
                accelerator.print(f"not trained: {len(unreached)} parameter(s) the {cfg.train.objective} objective "
                                  f"never reaches ({', '.join(unreached[:4])}{', ...' if len(unreached) > 4 else ''}), "
                                  f"frozen (DDP needs a gradient for every trained parameter; one process skips them "
                                  f"alike)")
        return objective

    def setup_optimizer(self) -> None:
        """AdamW (YaRN's defaults in the example configs), the scheduler, accelerate's prepare, trackers."""
        self._expect("setup_optimizer()", "model")
        cfg, accelerator = self.cfg, self.accelerator
        optimizer = torch.optim.AdamW([p for p in self.model.parameters() if p.requires_grad], lr=cfg.train.lr,
                                      betas=tuple(cfg.train.betas), eps=cfg.train.eps,
                                      weight_decay=cfg.train.weight_decay,
                                      fused=accelerator.device.type == "cpu")   # CPU: one kernel, not a loop
        self.scheduler = get_scheduler(cfg.train.scheduler, optimizer, num_warmup_steps=cfg.train.warmup_steps,
                                       num_training_steps=cfg.train.steps)
        self.objective, self.optimizer, self.dataloader = accelerator.prepare(self.objective, optimizer,
                                                                              self.dataloader)
        accelerator.register_for_checkpointing(self.scheduler)   # stepped once per optimizer step, by hand
        if cfg.train.report_to:
            accelerator.init_trackers("finetune", config=json.loads(json.dumps(cfg.to_dict(), default=str)))
        self.phase = "setup"

    # ------------------------------------------------------------------------------------------ resume
    def resume(self) -> int:
        """Where training starts: with `resume`, the newest complete checkpoint whose files are whole is
        loaded (a broken one is named and the one before it taken); then the loss log from that step and the
        micro-batches it had consumed skipped. Returns the step training goes on from (0: the beginning).
        Once, after setup: a second resume would rewind the data but not the weights."""
        self._expect("resume()", "setup")
        cfg, accelerator = self.cfg, self.accelerator
        self.start_step = self.step = ckpt.resume(accelerator, cfg.output_dir) if cfg.resume else 0
        self.log = ckpt.LossLog(cfg.output_dir, self.start_step, accelerator.is_main_process)
        left = cfg.train.steps - self.start_step
        if self.start_step and left > 0:
            pace = ckpt.seconds_per_step(cfg.output_dir)
            if pace:
                accelerator.print(f"the {left} steps left take about {duration(pace * left)} (the pace of the "
                                  f"steps logged)")
        self.batches = self.micro_batches(self.start_step * cfg.train.grad_accum)
        self.phase = "resumed"
        return self.start_step

    def micro_batches(self, consumed: int) -> Iterator[dict]:
        """The DataLoader's micro-batches from the `consumed`-th on, epoch after epoch (each epoch its own
        seeded order)."""
        epoch, skip = divmod(consumed, len(self.dataloader))
        while True:
            self.dataloader.set_epoch(epoch)
            yield from (self.accelerator.skip_first_batches(self.dataloader, skip) if skip else self.dataloader)
            epoch, skip = epoch + 1, 0

    # ------------------------------------------------------------------------------------------- train
    def train_step(self, step: int) -> dict:
        """Optimizer step `step` (1-based): grad_accum micro-batches under accelerator.accumulate, dropout
        seeded per micro-batch (the same draws after a resume), a non-finite loss stopped before the weights
        change. Returns its log record (loss, tokens, lr, tokens/s, peak memory), also written to log.jsonl.
        Only the next step (the last one taken + 1, up to train.steps), after resume."""
        self._expect(f"train_step({step!r})", "resumed")
        cfg, accelerator, objective = self.cfg, self.accelerator, self.objective
        if isinstance(step, bool) or not isinstance(step, int) or step != self.step + 1:
            raise PhaseOrderError(f"FinetuneRecipe.train_step({step!r}): the next step is {self.step + 1} (the last "
                                  f"step taken is {self.step}); train_step takes each step once, in order")
        if step > cfg.train.steps:
            raise PhaseOrderError(f"FinetuneRecipe.train_step({step}): the run has train.steps={cfg.train.steps}, "
                                  f"all taken; save_final() is next")
        objective.train()   # dropout and S2-Attn are on in a step taken by hand as in train()'s (setup loads in eval)
        started, losses, tokens = time.perf_counter(), [], 0
        for micro in range(cfg.train.grad_accum):
            batch = next(self.batches)
            torch.manual_seed(ckpt.step_seed(cfg.train.seed, step, micro))
            batch = window_batch(self.preflight, batch, cfg, accelerator, step, micro)
            with accelerator.accumulate(objective):
                loss = objective(batch["input_ids"], batch["attention_mask"], teacher=self.teacher,
                                 position_ids=batch.get("position_ids"))
                accelerator.backward(loss)
                losses.append(loss.detach())
                if accelerator.sync_gradients:
                    stop_if_diverged(accelerator, losses, step, cfg, self.progress.get("bar"))
                    if cfg.train.max_grad_norm:
                        accelerator.clip_grad_norm_(objective.parameters(), cfg.train.max_grad_norm)
                self.optimizer.step()
                self.optimizer.zero_grad()
            tokens += int(batch["attention_mask"].sum())
        self.scheduler.step()
        step_loss = accelerator.reduce(torch.stack(losses).mean(), reduction="mean").item()
        tokens = int(accelerator.reduce(torch.tensor(tokens, device=accelerator.device), reduction="sum"))
        record = {"step": step, "loss": step_loss, "tokens": tokens, "lr": self.scheduler.get_last_lr()[0],
                  "tokens_per_s": tokens / (time.perf_counter() - started), "peak_mem_mb": ckpt.peak_memory_mb()}
        if cfg.eval.every and step % cfg.eval.every == 0 and accelerator.is_main_process:
            record.update(self.evaluate())
        self.log.write(record)
        if cfg.train.report_to:
            accelerator.log({k: v for k, v in record.items() if k != "step"}, step=step)
        self.step = step
        return record

    def train(self):
        """From the step after the last one taken (`resume` is called here unless it was already) to
        train.steps: each step, its checkpoint when due, then the final model. Returns the final model, or
        None when train.stop_after_steps stopped the run first."""
        self._expect("train()", "setup", "resumed")
        cfg, accelerator = self.cfg, self.accelerator
        if self.phase == "setup":
            self.resume()
        first = self.step + 1
        bar = tqdm(total=cfg.train.steps, initial=self.step, disable=not accelerator.is_local_main_process,
                   desc="finetune")
        self.progress.update(bar=bar, step=self.step)
        for step in range(first, cfg.train.steps + 1):
            started = time.perf_counter()
            record = self.train_step(step)
            bar.set_postfix(loss=f"{record['loss']:.4f}", lr=f"{record['lr']:.2e}",
                            tok_s=f"{record['tokens_per_s']:.0f}", mem=f"{record['peak_mem_mb']:.0f}MB")
            bar.update()
            self.progress["step"] = step
            if step == first and step < cfg.train.steps:   # the first step of this call: the time left
                took = time.perf_counter() - started
                accelerator.print(f"step {step} took {duration(took)}: the {cfg.train.steps - step} steps left take "
                                  f"about {duration(took * (cfg.train.steps - step))}")
            if step % cfg.train.save_every == 0 or step == cfg.train.steps:
                self.save_checkpoint(step)
            if cfg.train.stop_after_steps and cfg.train.stop_after_steps <= step < cfg.train.steps:
                bar.close()
                accelerator.print(f"stopped after step {step} (train.stop_after_steps); continue with --resume")
                self.cleanup()
                return None
        bar.close()
        final = self.save_final()
        self.cleanup()
        return final

    # -------------------------------------------------------------------------------------------- save
    def save_checkpoint(self, step: int) -> None:
        """The full state (model, optimizer, scheduler, RNGs, sampler) into checkpoints/step_N, marked done
        with its file sizes once every process wrote its part; the oldest beyond train.keep_checkpoints go.
        `step` is the step last taken (a checkpoint holds the weights of its step: --resume goes on from it)."""
        self._expect(f"save_checkpoint({step!r})", "resumed")
        if self.step == 0 or isinstance(step, bool) or step != self.step:
            raise PhaseOrderError(f"FinetuneRecipe.save_checkpoint({step!r}) saves the step last taken, "
                                  + (f"{self.step}: call save_checkpoint({self.step})" if self.step
                                     else "and none is taken yet: train_step(1) first"))
        accelerator = self.accelerator
        folder = ckpt.checkpoint_dir(self.cfg.output_dir, step)
        if accelerator.is_main_process and folder.exists():
            ckpt.begin_checkpoint(folder)
        accelerator.save_state(str(folder))
        accelerator.wait_for_everyone()   # every process' RNG file is written before the manifest
        if accelerator.is_main_process:
            ckpt.mark_done(folder)
            ckpt.prune_checkpoints(self.cfg.output_dir, self.cfg.train.keep_checkpoints)

    def save_final(self):
        """The final model saved the hf_posenc way (stock-loadable config; LoRA merged), the tokenizer, the
        evaluation after training, the model card (which counts the steps taken). Returns the final model."""
        self._expect("save_final()", "resumed")
        cfg, accelerator = self.cfg, self.accelerator
        accelerator.wait_for_everyone()
        unwrapped = accelerator.unwrap_model(self.objective).model
        s2_attention.disable(unwrapped)   # the saved model and its evaluation: full attention
        if self.preflight.long_training.document_mask:
            documents.plain_sdpa(unwrapped)   # and transformers' own SDPA for what comes after training
        if cfg.train.lora:
            final, state_dict = unwrapped.merge_and_unload(), None
        else:   # the wrapper's state dict, its "model." prefix off
            state_dict = accelerator.get_state_dict(self.objective)
            final, state_dict = unwrapped, state_dict and {k.removeprefix("model."): v for k, v in state_dict.items()}
        if accelerator.is_main_process:
            final.save_pretrained(cfg.output_dir, state_dict=state_dict)
            fit_tokenizer(self.tokenizer, final)   # model_max_length: the patched context, which tools truncate to
            self.tokenizer.save_pretrained(cfg.output_dir)
            before, after = self.before, self.evaluate(final)
            for name, figures in (("eval_before.json", before), ("eval_after.json", after)):
                if figures:
                    open(f"{cfg.output_dir}/{name}", "w").write(json.dumps(figures, indent=2))
            describe = hp.describe(final) if cfg.posenc else carried_rope(final.config)
            tokens_seen = sum(r["tokens"] for r in ckpt.read_log(cfg.output_dir))
            write_model_card(cfg.output_dir, cfg, self.preflight, describe, self.step, tokens_seen, before, after)
            accelerator.print(f"saved to {cfg.output_dir}" + (f"; eval before {before}, after {after}" if after else ""))
        self.phase = "saved"
        return final

    def cleanup(self) -> None:
        """The trackers ended: the last phase (also of a run stopped early, after any phase of setup)."""
        self._expect("cleanup()", *PHASES[1:-1])
        self.accelerator.end_training()
        self.phase = "cleaned"

    # ---------------------------------------------------------------------------------------- evaluate
    def evaluate(self, model=None) -> dict:
        """eval.lengths on `model` (default: the model being trained): see `evaluate`. Once the model is set up."""
        self._expect("evaluate()", "model", "setup", "resumed", "saved")
        return evaluate(self.model if model is None else model, self.tokenizer, self.cfg, self.preflight,
                        self.teacher)


# The phases of a FinetuneRecipe in order (`phase`: the last one done), and where each leaves the recipe, as an
# out-of-order call says it.
PHASES = ("new", "accelerator", "data", "model", "setup", "resumed", "saved", "cleaned")
ORDER = ("setup -> resume -> train_step / train -> save_final -> cleanup (setup: setup_accelerator, setup_data, "
         "setup_model, setup_optimizer)")
AFTER = {"new": "before setup()", "accelerator": "after setup_accelerator() (setup_data() is next)",
         "data": "after setup_data() (setup_model() is next)",
         "model": "after setup_model() (setup_optimizer() is next)", "setup": "after setup() (resume() is next)",
         "resumed": "after resume()", "saved": "after save_final() (cleanup() is next)",
         "cleaned": "after cleanup(): the run is over"}


class PhaseOrderError(hp.PosEncError, RuntimeError):
    """A FinetuneRecipe phase called out of order (before the phase it needs, twice, or a step not next)."""


def run_summary(cfg: FinetuneConfig, preflight: Preflight, processes: int) -> str:
    """What the run is about to do, printed before anything loads: the model, the patch, the objective, the
    steps and tokens, the output folder, and when a time can be told (after the first step, or at once when
    resuming a run whose steps are logged)."""
    carried = preflight.carried.get("rope_type") if not cfg.posenc else None
    patch = (f"the {carried} RoPE it carries, no posenc patch" if carried else "no posenc patch" if not cfg.posenc
             else "posenc " + " ".join([cfg.posenc["method"], *(f"{k}={v}" for k, v in cfg.posenc.items()
                                                                  if k != "method")]))
    context = (f"{preflight.original_context} -> {preflight.target_context} positions"
               if preflight.target_context != preflight.original_context else f"{preflight.target_context} positions")
    trains = "LoRA adapters" if cfg.train.lora else ("all weights" if cfg.train.trainable == "all"
                                                     else f"trainable {cfg.train.trainable}")
    if cfg.train.lora and cfg.train.trainable != "all":
        trains += f" + {cfg.train.trainable}"
    sequences = cfg.train.batch_size * cfg.train.grad_accum * processes
    per_step = sequences * preflight.seq_len
    shares = f", {cfg.data.short_share:.0%} of them cut to {preflight.short_len}" if preflight.short_len else ""
    shares += f", each taken from a span of {preflight.block_len} tokens" if preflight.positions.span else ""
    positions = f", position ids {cfg.train.positions}" if preflight.positions.spreads else ""
    long = preflight.long_training
    positions += f"; {long.describe()}" if long.said else ""   # the default unsaid
    teacher = f" from the {cfg.train.teacher} teacher" if cfg.train.objective == "distill" else ""
    lines = [f"fine-tune {cfg.model.name}: {patch} ({context}), objective {cfg.train.objective}{teacher}, {trains}"
             f"{positions}",
             f"  {cfg.train.steps} steps x {sequences} sequences of {preflight.seq_len} tokens{shares} (batch_size "
             f"{cfg.train.batch_size} x grad_accum {cfg.train.grad_accum} x {processes} process"
             f"{'es' if processes > 1 else ''}) = up to {per_step:,} tokens a step, {per_step * cfg.train.steps:,} in all",
             f"  output: {cfg.output_dir}" + (" (resuming its run)" if cfg.resume else "")
             + f"; checkpoints every {cfg.train.save_every} steps",
             *([f"  resumed with changes that leave what it trains as it was: {', '.join(preflight.resume_changes)}"]
               if preflight.resume_changes else []),
             *([f"  not used: {', '.join(unused)}"] if (unused := unused_settings(cfg.train)) else []),
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


def window_batch(preflight: Preflight, batch: dict, cfg: FinetuneConfig, accelerator, step: int, micro: int) -> dict:
    """The micro-batch as train.positions trains it: with the position ids of its windows (none: contiguous,
    the model's own 0..n-1), and for text=span each target-long span cut to its window's tokens at those ids.
    Row r of micro-batch `micro` of optimizer step `step` on process p is window number
    ((((step - 1) * grad_accum + micro) * processes + p) * batch_size + r) of the run, and its ids depend
    only on (seed, that number): a resumed run draws the same ids, each process those of its own windows.
    With train.mixed_windows, a micro-batch drawn short (from the seed and its number, alike on every process)
    is cut to its first tokens inside the original context, at 0..n-1 (or its documents' ids)."""
    scheme, long = preflight.positions, preflight.long_training
    consumed = (step - 1) * cfg.train.grad_accum + micro
    if long.switched and mixed_windows.drawn_short(seed=cfg.train.seed, index=consumed, share=long.mixed_share):
        # inside the original context: its first tokens at 0..n-1 (the switched rope turns to its short set)
        return {k: v[:, :long.short_tokens] for k, v in batch.items()}
    if not scheme.spreads:
        return batch
    first = (consumed * accelerator.num_processes + accelerator.process_index) * cfg.train.batch_size
    if long.document_mask:   # the spread ids inside each document kept apart
        return documents.spread_in_documents(batch, scheme, seed=cfg.train.seed, first_index=first,
                                             window=preflight.seq_len)
    return scheme.add_position_ids(batch, seed=cfg.train.seed, first_index=first, window=preflight.seq_len)


def window_positions(preflight: Preflight, batch: dict, cfg: FinetuneConfig, accelerator, step: int, micro: int):
    """The position ids train.positions gives this micro-batch (None: contiguous): `window_batch`'s."""
    return window_batch(preflight, batch, cfg, accelerator, step, micro).get("position_ids")


@torch.no_grad()
def evaluate(model, tokenizer, cfg: FinetuneConfig, preflight: Preflight, teacher=None) -> dict:
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
        if preflight.causal:
            from hf_posenc import eval as hpe

            ids = corpora.tokenize(docs, tokenizer)["input_ids"]
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


def load_model(cfg: FinetuneConfig):
    """The model to train, with the attention implementation and the dtype the hardware runs."""
    ref = resolve_alias(cfg.model.name)
    auto = cfg.model.attn_implementation == "auto"   # chosen by the model's class
    config = loading.load_config(ref, gguf_file=cfg.model.gguf_file) if auto else None
    kwargs = {"attn_implementation": choose_attention(cfg.model.attn_implementation, config)}
    if cfg.model.dtype != "auto":
        kwargs["dtype"] = getattr(torch, cfg.model.dtype)
    return loading.load_model(ref, gguf_file=cfg.model.gguf_file, **kwargs)


def load_tokenizer(cfg: FinetuneConfig):
    ref = resolve_alias(cfg.model.name)
    try:
        return loading.load_tokenizer(ref, gguf_file=cfg.model.gguf_file)
    except (OSError, ValueError) as err:   # no tokenizer files beside the model, a backend missing, ...
        raise ConfigError(f"cannot load the tokenizer of {ref!r}: {one_line(err)}") from None
