"""The fine-tuning objectives, as one module the accelerate wrapper runs.

A causal LM's float logits over its vocabulary are most of a long-context training step's memory
(SmolLM2: 49k entries, ~0.4 MiB a token in float32, more for their gradient and the softmax). With
`chunk` set, the output layer and the loss (cross-entropy, or the distillation KL) run `chunk` positions
at a time, each block recomputed in the backward pass (activation checkpointing), so the logits of the
whole sequence never exist. Same loss and gradients as the full computation (tests/test_losses.py).

`LongCE` weights each token's loss by how much the long context helps it (Fang et al., ICLR 2025), from
short-context losses the model computes without gradient in the same step (tests/test_longce.py).

The losses a fine-tune trains with (`train.loss`) are registered with `@register_loss` in `LOSSES` (`ce`,
`longce`; docs/ARCHITECTURE.md, "Training losses"), each checked by tests/test_loss_contract.py.

`TrainingLoss` wraps the model so that `accelerator.prepare` wraps the loss as well: DDP and FSDP see
one forward that returns the loss, and their hooks stay in charge of the gradients."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, ClassVar, Optional

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from ..config import Refused, check_number
from ..causal_lm import (check_causal_lm, check_token_ids, check_window, hidden_states, next_token_losses,
                         output_logits, position_blocks, short_context_losses, unwrapped)
from ..named import Registry
from ..errors import (ConfigError, InvalidInputError, InvalidParameterError, ParameterTypeError, PosEncError,
                      UnsupportedModelError)



def lm_loss(model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
            position_ids: torch.Tensor | None = None) -> torch.Tensor:
    """Mean next-token loss over the real (unpadded) tokens, from the full logits; `position_ids` (None:
    0..n-1) are the ids a position scheme gives the window (hf_posenc/train/positions.py)."""
    check_causal_lm(model, "lm_loss")   # an encoder's logits are not next-token predictions
    logits = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                   use_cache=False).logits
    labels = input_ids.masked_fill(attention_mask == 0, -100)
    return F.cross_entropy(logits[:, :-1].float().flatten(0, 1), labels[:, 1:].flatten(), ignore_index=-100)


def distill_loss(model: nn.Module, teacher: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, *,
                 causal: bool, temperature: float = 1.0, position_ids: torch.Tensor | None = None) -> torch.Tensor:
    """Match the teacher (the unpatched model, or one that reads long contexts) on the same tokens:
    KL(teacher || student) on the logits of a causal LM; for an encoder, MSE on the output of every layer,
    averaged (a denser signal than the last layer alone: MiniLM heals to 0.957 instead of 0.942 in the same
    steps); padding excluded. `position_ids` (causal LMs): both models read the tokens at these ids."""
    _check_teacher(teacher)
    inputs = {"input_ids": input_ids, "attention_mask": attention_mask}
    if position_ids is not None:
        inputs["position_ids"] = position_ids
    mask = attention_mask.bool()
    extra = {"use_cache": False} if causal else {"output_hidden_states": True}
    with torch.no_grad():
        target = teacher(**inputs, **extra)
    out = model(**inputs, **extra)
    if causal:
        t = F.log_softmax(target.logits[mask].float() / temperature, -1)
        s = F.log_softmax(out.logits[mask].float() / temperature, -1)
        return F.kl_div(s, t, log_target=True, reduction="batchmean") * temperature ** 2
    pairs = list(zip(out.hidden_states[1:], target.hidden_states[1:]))   # [0]: the embeddings, positions differ
    return sum(F.mse_loss(s[mask].float(), t[mask].float()) for s, t in pairs) / len(pairs)


def _check_teacher(teacher) -> None:
    if not isinstance(teacher, nn.Module):
        raise InvalidInputError(f"distill needs the teacher model (the unpatched model), got {teacher!r:.60}")


def _check_batch(model: nn.Module, input_ids, attention_mask, position_ids=None) -> None:
    """input_ids and attention_mask: [batch, n >= 2] integer tensors alike, the ids in the vocabulary; position
    ids (when given) n a row."""
    def is_ids(value) -> bool:
        return isinstance(value, torch.Tensor) and value.dim() == 2 and not value.is_floating_point() \
            and not value.is_complex()

    def shape(value) -> str:
        return f"{tuple(value.shape)} of {value.dtype}" if isinstance(value, torch.Tensor) else f"{value!r:.40}"

    if not is_ids(input_ids) or input_ids.shape[1] < 2:
        raise InvalidInputError(f"input_ids must be a [batch, n >= 2] tensor of token ids, got {shape(input_ids)}")
    if not is_ids(attention_mask) or attention_mask.shape != input_ids.shape:
        raise InvalidInputError(f"attention_mask must be an int tensor of input_ids' shape "
                                f"{tuple(input_ids.shape)}, got {shape(attention_mask)}")
    if position_ids is not None and (not is_ids(position_ids) or position_ids.shape[1] != input_ids.shape[1]):
        raise InvalidInputError(f"position_ids must be an int tensor of {input_ids.shape[1]} ids a row (input_ids' "
                                f"length), got {shape(position_ids)}")
    check_token_ids(model, input_ids)


def chunked_lm_loss(model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                    chunk: int, position_ids: torch.Tensor | None = None) -> torch.Tensor:
    """`lm_loss`, `chunk` positions of logits at a time."""
    check_causal_lm(model, "chunked_lm_loss")
    check_number("chunk", chunk, minimum=1, integer=True, optional=False)
    hidden = hidden_states(model, input_ids, attention_mask, position_ids)[:, :-1]
    labels = input_ids.masked_fill(attention_mask == 0, -100)[:, 1:]

    def block_sum(h: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        logits = output_logits(model, h).float()
        return F.cross_entropy(logits.flatten(0, 1), y.flatten(), ignore_index=-100, reduction="sum")

    total = sum(checkpoint(block_sum, hidden[:, b], labels[:, b], use_reentrant=False)
                for b in position_blocks(hidden.shape[1], chunk))
    return total / (labels != -100).sum().clamp(min=1)


def chunked_distill_loss(model: nn.Module, teacher: nn.Module, input_ids: torch.Tensor,
                         attention_mask: torch.Tensor, chunk: int, temperature: float = 1.0,
                         position_ids: torch.Tensor | None = None) -> torch.Tensor:
    """`distill_loss` of a causal LM, `chunk` positions of both models' logits at a time."""
    _check_teacher(teacher)
    check_number("chunk", chunk, minimum=1, integer=True, optional=False)
    with torch.no_grad():
        target = hidden_states(teacher, input_ids, attention_mask, position_ids)
    hidden = hidden_states(model, input_ids, attention_mask, position_ids)
    mask = attention_mask.bool()

    def block_sum(h: torch.Tensor, t: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            p = F.log_softmax(output_logits(teacher, t[m]).float() / temperature, -1)
        q = F.log_softmax(output_logits(model, h[m]).float() / temperature, -1)
        return F.kl_div(q, p, log_target=True, reduction="sum")

    total = sum(checkpoint(block_sum, hidden[:, b], target[:, b], mask[:, b], use_reentrant=False)
                for b in position_blocks(hidden.shape[1], chunk))
    return total / mask.sum().clamp(min=1) * temperature ** 2


# -- the training losses `train.loss` names: a registry ----------------------------------------------------

@dataclass(frozen=True)
class LossContract:
    """What a loss declares for the contract suite (tests/test_loss_contract.py): `examples`, the parameters it
    runs with; `plain`, parameters at which it is the plain cross-entropy (None: at none); `refused`, parameters
    it must refuse, each `config.Refused(params, "words of the error")`."""

    examples: tuple[dict, ...] = ({},)
    plain: Optional[dict] = None
    refused: tuple = ()


@dataclass(frozen=True)
class LossRun:
    """What a fine-tune tells a loss about its run (`TrainLoss.for_run`)."""

    model: Any        # the model, or its skeleton before the weights load
    objective: str    # train.objective: lm or distill
    attention: str    # train.attention: full or s2
    original: int     # the model's original context
    seq_len: int      # tokens of a training sequence


@dataclass(frozen=True)
class TrainLoss:
    """A causal LM's next-token training loss (`train.loss`). Its parameters are dataclass fields, checked in
    `__post_init__` by messages that begin with the parameter's name (as `config.check_number`'s do); a fine-tune
    sets them as `train.<name>_<parameter>`. A loss writes `token_losses` (each real token's loss from its
    cross-entropy), or all of `lm_loss` when it needs more than that."""

    name: ClassVar[str]
    summary: ClassVar[str] = ""
    contract: ClassVar[LossContract] = LossContract()

    def token_losses(self, losses: torch.Tensor) -> torch.Tensor:
        """Each token's loss from `losses`, its cross-entropy ([batch, n - 1], with gradient)."""
        raise NotImplementedError

    def _checked_token_losses(self, losses: torch.Tensor) -> torch.Tensor:
        """`token_losses`, refused where it breaks its contract: one loss a token (a scalar or a row's would be
        broadcast over every token without a word), with the gradient when `losses` has one (a detached result
        trains nothing)."""
        out = self.token_losses(losses)
        where = f"training loss {self.name!r} ({type(self).__module__}.{type(self).__qualname__}).token_losses"
        if not isinstance(out, torch.Tensor) or out.shape != losses.shape:
            raise InvalidInputError(f"{where} must return one loss a token, shape {tuple(losses.shape)}, got "
                                    f"{tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__}")
        if losses.requires_grad and not out.requires_grad:
            raise InvalidInputError(f"{where} returned losses without their gradient (detached): the step would "
                                    f"train nothing")
        return out

    def lm_loss(self, model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, *, chunk: int = 0,
                position_ids: torch.Tensor | None = None) -> torch.Tensor:
        """The training step's loss: `token_losses` summed over the real tokens, over their number; `chunk`
        positions of logits at a time (0: the full logits), each block recomputed in the backward pass."""
        labels = input_ids.masked_fill(attention_mask == 0, -100)[:, 1:]
        real = labels != -100   # padding neither counts nor weighs, whatever token_losses makes of its 0

        def block_sum(losses: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
            return (self._checked_token_losses(losses) * keep).sum()

        if chunk:
            hidden = hidden_states(model, input_ids, attention_mask, position_ids)[:, :-1]
            total = sum(checkpoint(lambda h, y, k: block_sum(next_token_losses(model, h, y, 0), k),
                                   hidden[:, b], labels[:, b], real[:, b], use_reentrant=False)
                        for b in position_blocks(hidden.shape[1], chunk))
        else:
            logits = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                           use_cache=False).logits[:, :-1].float()
            total = block_sum(F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100,
                                              reduction="none").view(labels.shape), real)
        return total / real.sum().clamp(min=1)

    @classmethod
    def for_run(cls, settings: dict, run: LossRun) -> TrainLoss:
        """The loss a fine-tune trains with: `settings` are its `train.<name>_<parameter>` values by parameter
        (the parameters the config has no field for keep their defaults). Refused in one line naming the
        setting; a loss that needs more of the run (its model, its lengths) checks it here."""
        if run.objective != "lm":
            raise ConfigError(f"train.loss={cls.name} weights a causal LM's next-token loss (objective lm), got "
                              f"train.objective={run.objective!r}")
        try:
            return cls(**settings)
        except PosEncError as err:   # the message begins with the parameter: name the setting the user wrote
            named = str(err).split(" ", 1)[0] in settings
            raise ConfigError(f"train.{cls.name}_{err}" if named else f"train.loss={cls.name}: {err}") from None

    def describe(self) -> str:
        """One line for the model card and the run's summary."""
        parameters = ", ".join(f"{f.name}={getattr(self, f.name)}" for f in dataclasses.fields(self))
        return f"{self.summary}" + (f" ({parameters})" if parameters else "")


LOSSES = Registry("training loss", TrainLoss, setting="train.loss", decorator="register_loss", dataclass=True)


def register_loss(cls: type[TrainLoss]) -> type[TrainLoss]:
    """Class decorator: make `cls` a loss `train.loss` names (docs/ARCHITECTURE.md, "Training losses"). A name
    already taken is refused, naming both classes."""
    return LOSSES.register(cls)


@register_loss
@dataclass(frozen=True)
class CrossEntropy(TrainLoss):
    """The mean next-token cross-entropy over the real tokens: what a fine-tune trains by default."""

    name: ClassVar[str] = "ce"
    summary: ClassVar[str] = "cross-entropy"
    contract: ClassVar[LossContract] = LossContract(examples=({},), plain={})

    def token_losses(self, losses: torch.Tensor) -> torch.Tensor:
        return losses

    def lm_loss(self, model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, *, chunk: int = 0,
                position_ids: torch.Tensor | None = None) -> torch.Tensor:
        if chunk:
            return chunked_lm_loss(model, input_ids, attention_mask, chunk, position_ids)
        return lm_loss(model, input_ids, attention_mask, position_ids)

    @classmethod
    def for_run(cls, settings: dict, run: LossRun) -> TrainLoss:
        return cls()   # any objective: distill trains its own loss, and ce is the config's default


# -- LongCE: each token weighted by how much the long context helps it -------------------------------------

@register_loss
@dataclass(frozen=True)
class LongCE(TrainLoss):
    """LongCE (Fang et al., ICLR 2025, "What is Wrong with Perplexity for Long-context Language Modeling?",
    Sec. 4): the cross-entropy of each token t weighted by

        w_t = min(exp(LSD_t), clip),   LSD_t = log P(x_t | x_<t) - log P(x_t | the `window`.. tokens before t)
                                             = loss_short_t - loss_long_t,

    the clipped ratio of the token's probability given everything to its probability given a short window
    (the paper's I(x_t) with gamma = clip = 5), computed by the model being trained, without gradient, in the
    same step. The loss is sum_t w_t loss_t / N over the N real tokens (the paper's sum, divided as a mean, as
    the plain loss is). `floor` bounds the weights from below (0, the paper's: none; 1: the long context only
    adds weight, a token it does not help keeps its plain loss). The short windows are cut as the paper's:
    windows of window + stride tokens, stride apart, each scoring its last `stride` tokens, so a token's short
    context holds window .. window + stride - 1 tokens. The first window is the whole context of the tokens it
    would score, so the tokens before window + stride have w_t = 1 exactly, and no forward is spent on them. A
    window keeps the ids the long pass gives its tokens (a position scheme's too), so the two losses differ by
    the context alone."""

    name: ClassVar[str] = "longce"
    summary: ClassVar[str] = ("LongCE (Fang et al. 2025): each token's loss weighted by min(P(long) / P(short), "
                              "clip), the short-context probability computed by the model without gradient")
    contract: ClassVar[LossContract] = LossContract(
        examples=({"window": 8, "stride": 4, "clip": 1.1}, {"window": 8, "stride": 6, "clip": 1.1, "floor": 0.95}),
        plain={"window": 8, "stride": 4, "clip": 1.0, "floor": 1.0},   # every weight 1
        refused=(Refused({"window": 0, "stride": 4}, "window must be an int >= 1"),
                 Refused({"window": 8, "stride": 2.5}, "stride must be an int >= 1"),
                 Refused({"window": 8, "stride": 4, "clip": 0.5}, "clip must be a number >= 1"),
                 Refused({"window": 8, "stride": 4, "floor": 1.5}, "floor must be a number in [0, 1]")))

    window: int
    stride: int
    clip: float = 5.0
    floor: float = 0.0

    def __post_init__(self):
        for name in ("window", "stride"):
            check_window(name, getattr(self, name))
        _check_weights(self.clip, self.floor)

    def lm_loss(self, model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, *, chunk: int = 0,
                position_ids: torch.Tensor | None = None) -> torch.Tensor:
        return _longce_loss(model, input_ids, attention_mask, self, chunk, position_ids)

    @classmethod
    def for_run(cls, settings: dict, run: LossRun) -> TrainLoss:
        """window None: the original context; stride None: the window. Refused: S2-Attn, a model with absolute
        positions, a window that leaves no token a shorter context."""
        where = "train.loss=longce"
        if run.attention == "s2":
            raise ConfigError(f"train.attention=s2 and {where} do not go together: LongCE weighs each token by how "
                              f"much the whole window helps it, but under S2-Attn the training forward sees only "
                              f"groups of tokens; use one or the other")
        window = run.original if settings.get("window") is None else settings["window"]
        stride = window if settings.get("stride") is None else settings["stride"]
        loss = super().for_run({**settings, "window": window, "stride": stride}, run)
        from .. import api

        mechanism = api.describe(run.model)["mechanism"]
        if mechanism not in ("rope", "bias"):
            raise ConfigError(f"{where} compares each token's loss given a short window at the same positions with "
                              f"its loss given everything, which only relative positions (RoPE, a bias) read as "
                              f"less context; this model's positions are {mechanism!r} (a learned table: one "
                              f"absolute row per position); patch it to rope first (posenc: {{method: rope}}) or "
                              f"use train.loss=ce")
        if window + stride >= run.seq_len:
            said = "" if settings.get("window") is not None else " (its default: the original context)"
            raise ConfigError(f"train.longce_window={window}{said} + train.longce_stride={stride} must be below "
                              f"data.seq_len={run.seq_len}: only a token after window + stride tokens has a shorter "
                              f"context to compare; lower train.longce_window")
        return loss

    def describe(self) -> str:
        weight = f"min(P(long) / P(short), {self.clip:g})"
        if self.floor:
            weight = f"max({weight}, {self.floor:g})"
        return (f"LongCE (Fang et al. 2025): each token's loss weighted by {weight}, the short context "
                f"{self.window}-{self.window + self.stride - 1} tokens")


def _check_weights(clip, floor, owner: str = "") -> None:
    """clip >= 1 (the largest weight: below 1 every weight would shrink) and floor in [0, 1] (the smallest)."""
    if not (isinstance(clip, (int, float)) and not isinstance(clip, bool) and 1 <= clip < math.inf):
        raise InvalidParameterError(f"{owner}clip must be a number >= 1 (the largest weight), got {clip!r}")
    if not (isinstance(floor, (int, float)) and not isinstance(floor, bool) and 0 <= floor <= 1):
        raise InvalidParameterError(f"{owner}floor must be a number in [0, 1] (the smallest weight), got {floor!r}")


def longce_weights(long: torch.Tensor, short: torch.Tensor, clip: float, floor: float = 0.0) -> torch.Tensor:
    """max(min(exp(short - long), clip), floor) where `short` holds a loss, 1 where it is NaN (no short window)."""
    _check_weights(clip, floor)
    if not isinstance(long, torch.Tensor) or not isinstance(short, torch.Tensor) or long.shape != short.shape:
        raise InvalidInputError(f"long and short must be loss tensors of one shape, got "
                                f"{getattr(long, 'shape', type(long).__name__)} and "
                                f"{getattr(short, 'shape', type(short).__name__)}")
    has = ~torch.isnan(short)
    ratio = torch.exp(torch.where(has, short - long, torch.zeros_like(long))).clamp(min=floor, max=clip)
    return torch.where(has, ratio, torch.ones_like(ratio))


def longce_loss(model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, longce: LongCE,
                chunk: int = 0, position_ids: torch.Tensor | None = None) -> torch.Tensor:
    """`LongCE`: the short-context losses first (no gradient), then the long pass with each token's loss
    weighted; `chunk` positions of logits at a time (0: the full logits). The weights come from the long
    losses themselves, detached (in a chunk's recomputation in the backward pass, the same weights). Refused
    before any work: a model that is not a causal LM or whose positions are absolute (see `check_longce`), ids
    outside its vocabulary."""
    check_longce(model, longce, chunk)
    _check_batch(model, input_ids, attention_mask, position_ids)
    return _longce_loss(model, input_ids, attention_mask, longce, chunk, position_ids)


def check_longce(model: nn.Module, longce, chunk: int = 0) -> None:
    """Whether `longce_loss` can weight this model's tokens: a causal LM whose positions are relative (RoPE, a
    bias). With a learned table, a short window at the long pass's ids reads absolute rows, not less context."""
    check_causal_lm(model, "longce_loss")
    if not isinstance(longce, LongCE):
        raise ParameterTypeError(f"longce must be a LongCE(window, stride, ...), got {longce!r:.60}")
    check_number("chunk", chunk, minimum=0, integer=True, optional=False)
    from .. import api

    try:
        mechanism = api.describe(unwrapped(model))["mechanism"]
    except UnsupportedModelError:   # no family knows where its positions are: nothing to say against it
        return
    if mechanism not in ("rope", "bias"):
        raise UnsupportedModelError(
            f"longce_loss compares each token's loss given a short window at the same positions with its loss "
            f"given everything, which only relative positions (RoPE, a bias) read as less context; this model's "
            f"positions are {mechanism!r}: patch it to rope first (hp.patch(model, 'rope')) or use the plain loss")


def _longce_loss(model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, longce: LongCE,
                 chunk: int = 0, position_ids: torch.Tensor | None = None) -> torch.Tensor:
    """`longce_loss` without its checks: the training step's, checked once when the loss was built."""
    short = short_context_losses(model, input_ids, attention_mask, longce.window, longce.stride, position_ids,
                                 chunk or input_ids.shape[1])
    labels = input_ids.masked_fill(attention_mask == 0, -100)[:, 1:]

    def weighted_sum(losses: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        return (longce_weights(losses.detach(), s, longce.clip, longce.floor) * losses).sum()

    if chunk:
        hidden = hidden_states(model, input_ids, attention_mask, position_ids)[:, :-1]

        def block_sum(h: torch.Tensor, y: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
            return weighted_sum(next_token_losses(model, h, y, 0), s)

        total = sum(checkpoint(block_sum, hidden[:, b], labels[:, b], short[:, b], use_reentrant=False)
                    for b in position_blocks(hidden.shape[1], chunk))
    else:
        logits = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                       use_cache=False).logits[:, :-1].float()
        losses = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100,
                                 reduction="none").view(labels.shape)
        total = weighted_sum(losses, short)
    return total / (labels != -100).sum().clamp(min=1)


class TrainingLoss(nn.Module):
    """The model with its objective: `forward(input_ids, attention_mask, teacher=None, position_ids=None)`
    returns the loss (position ids: objective lm only, hf_posenc/train/positions.py).
    `chunk` (causal LMs): positions of logits at a time, 0 for the full logits. `loss` (objective lm): a
    registered training loss (`LOSSES`: `train.loss`); `longce`, the same as loss=LongCE(...): the tokens
    weighted by how much the long context helps them. `documents` (objective lm): the position ids given restart
    at each packed document, and attention stays inside each (hf_posenc/train/documents.py). The teacher of `distill`
    is an argument, not a submodule: frozen, it stays outside what DDP / FSDP wrap. `teacher_reads_ids`
    (distill, causal LMs): the teacher reads a window's spread ids (Self-Extend), so both models get them."""

    def __init__(self, model: nn.Module, *, objective: str, causal: bool, chunk: int = 0,
                 temperature: float = 1.0, longce: LongCE | None = None, loss: TrainLoss | None = None,
                 documents: bool = False, teacher_reads_ids: bool = False):
        super().__init__()
        if objective not in ("lm", "distill"):
            raise InvalidParameterError(f"objective must be 'lm' or 'distill', got {objective!r}")
        if longce is not None and not (objective == "lm" and causal):
            raise InvalidParameterError("LongCE weights a causal LM's next-token loss: objective lm only")
        if longce is not None and not isinstance(longce, LongCE):
            raise ParameterTypeError(f"longce must be a LongCE(window, stride, ...) or None, got {longce!r:.60}")
        if loss is not None and not isinstance(loss, TrainLoss):
            raise ParameterTypeError(f"loss must be a training loss (losses.LOSSES: {', '.join(LOSSES)}) or None, "
                                     f"got {loss!r:.60}")
        if loss is not None and (objective != "lm" or longce is not None):
            raise InvalidParameterError(f"loss={loss!r:.60} is a next-token loss: objective lm only, and not with "
                                        f"longce= (give one)")
        check_number("chunk", chunk, minimum=0, integer=True, optional=False)
        self.model, self.objective, self.causal = model, objective, causal
        if documents and objective != "lm":
            raise InvalidParameterError("documents=True keeps a causal LM's packed documents apart: objective lm only")
        self.chunk, self.temperature, self.loss = chunk if causal else 0, temperature, (
            loss if loss is not None else longce)
        self.documents = documents
        if teacher_reads_ids and not (objective == "distill" and causal):
            raise InvalidParameterError("teacher_reads_ids=True: a causal LM's distill objective only")
        self.teacher_reads_ids = teacher_reads_ids

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, teacher: nn.Module | None = None,
                position_ids: torch.Tensor | None = None):
        if self.documents:   # each document its own sequence: the position ids restart at each (documents.py)
            from .documents import kept_apart

            with kept_apart(self.model):
                return self._loss(input_ids, attention_mask, teacher, position_ids)
        return self._loss(input_ids, attention_mask, teacher, position_ids)

    def _loss(self, input_ids, attention_mask, teacher, position_ids):
        if self.objective == "lm":
            if self.loss is not None:
                return self.loss.lm_loss(self.model, input_ids, attention_mask, chunk=self.chunk,
                                         position_ids=position_ids)
            if self.chunk:
                return chunked_lm_loss(self.model, input_ids, attention_mask, self.chunk, position_ids)
            return lm_loss(self.model, input_ids, attention_mask, position_ids)
        if position_ids is not None and not self.teacher_reads_ids:
            raise ValueError("position ids are for objective lm, or distill from a teacher that reads them "
                             "(teacher_reads_ids); the unpatched teacher is matched at the true positions")
        if self.chunk:
            return chunked_distill_loss(self.model, teacher, input_ids, attention_mask, self.chunk,
                                        self.temperature, position_ids)
        return distill_loss(self.model, teacher, input_ids, attention_mask, causal=self.causal,
                            temperature=self.temperature, position_ids=position_ids)

    def extra_repr(self) -> str:
        return f"objective={self.objective!r}, chunk={self.chunk}" + (f", {self.loss}" if self.loss else "")
