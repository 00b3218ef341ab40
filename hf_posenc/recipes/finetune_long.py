"""The fine-tune recipe's long-context training options: shifted sparse attention in training
(`train.attention: s2`, hf_posenc/s2_attention.py; Chen et al., ICLR 2024, "LongLoRA") and the long-context
loss (`train.loss: longce`, hf_posenc/losses.LongCE; Fang et al., ICLR 2025). Their values are checked with
the config (`check_fields`, plain Python: `--help` loads no torch), against the model's skeleton and the run's
windows before anything loads (`check_long_training`, called by finetune_checks.check_config), and what they
resolve to (`LongTraining`, kept in the Preflight) sets up the model and the loss (finetune_recipe.py).

S2-Attn trains only: the saved model and every evaluation use full attention (s2_attention.disable before
the save; the function itself runs SDPA over everything in eval mode)."""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING, Optional

from ..errors import ConfigError, PosEncError

if TYPE_CHECKING:
    from ..losses import LongCE
    from ..positions import PositionScheme
    from .finetune_config import FinetuneConfig, TrainArgs

ATTENTIONS = ("full", "s2")
LOSSES = ("ce", "longce")


def _int_at_least(value, low: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= low


def check_fields(train: TrainArgs) -> None:
    """The values alone (TrainArgs.__post_init__)."""
    if train.attention not in ATTENTIONS:
        raise ConfigError(f"train.attention must be one of {', '.join(ATTENTIONS)} (s2: LongLoRA's shifted sparse "
                          f"attention in training), got {train.attention!r}")
    if train.loss not in LOSSES:
        raise ConfigError(f"train.loss must be one of {', '.join(LOSSES)} (longce: each token weighted by how much "
                          f"the long context helps it), got {train.loss!r}")
    if not (train.s2_group is None or _int_at_least(train.s2_group, 2)):
        raise ConfigError(f"train.s2_group must be an int >= 2 (tokens per attention group) or null (a quarter "
                          f"of data.seq_len), got {train.s2_group!r}")
    if not isinstance(train.s2_shift, bool):
        raise ConfigError(f"train.s2_shift must be true or false, got {train.s2_shift!r}")
    for name in ("longce_window", "longce_stride"):
        value = getattr(train, name)
        if not (value is None or _int_at_least(value, 1)):
            raise ConfigError(f"train.{name} must be an int >= 1 or null, got {value!r}")
    clip = train.longce_clip
    if isinstance(clip, bool) or not isinstance(clip, (int, float)) or not 1 <= clip < math.inf:
        raise ConfigError(f"train.longce_clip must be a number >= 1 (the largest weight a token gets; the paper: "
                          f"5), got {clip!r}")
    floor = train.longce_floor
    if isinstance(floor, bool) or not isinstance(floor, (int, float)) or not 0 <= floor <= 1:
        raise ConfigError(f"train.longce_floor must be a number in [0, 1] (the smallest weight a token gets; the "
                          f"paper: 0), got {floor!r}")


def unused_settings(train: TrainArgs) -> list[str]:
    """The s2_* / longce_* settings this run sets away from their defaults without the attention / loss that
    reads them ("train.longce_floor=1 (train.loss is ce)"): said on the run's summary, so that an option
    given without its switch is not silently a plain run."""
    defaults = {f.name: f.default for f in dataclasses.fields(train)}
    off = {"s2_": (train.attention != "s2", f"train.attention is {train.attention}"),
           "longce_": (train.loss != "longce", f"train.loss is {train.loss}")}
    return [f"train.{name}={getattr(train, name)} ({why})" for name in defaults
            for prefix, (unused, why) in off.items()
            if name.startswith(prefix) and unused and getattr(train, name) != defaults[name]]


@dataclasses.dataclass(frozen=True)
class LongTraining:
    """What train.attention and train.loss resolve to for this run."""
    s2_group: Optional[int] = None   # S2-Attn's tokens per group; None: full attention in training
    s2_shift: bool = True
    longce: Optional[LongCE] = None   # None: the plain loss

    def describe(self) -> str:
        """One line for the model card and the run's summary."""
        if self.s2_group:
            attention = (f"S2-Attn (LongLoRA) in training: attention inside groups of {self.s2_group} tokens"
                         + (f", half the heads on the groups shifted by {self.s2_group // 2}" if self.s2_shift
                            else ", no shift") + "; the saved model uses full attention")
        else:
            attention = "full attention"
        if self.longce:
            weight = f"min(P(long) / P(short), {self.longce.clip:g})"
            if self.longce.floor:
                weight = f"max({weight}, {self.longce.floor:g})"
            loss = (f"LongCE (Fang et al. 2025): each token's loss weighted by {weight}, the short context "
                    f"{self.longce.window}-{self.longce.window + self.longce.stride - 1} tokens")
        else:
            loss = "cross-entropy"
        return f"{attention}; {loss}"


def check_long_training(cfg: FinetuneConfig, model, ref: str, original: int, seq_len: int,
                        short_len: Optional[int], positions: PositionScheme) -> LongTraining:
    """train.attention / train.loss against the run: refused in one line where they cannot work (S2: a group
    size that does not split every training sequence into whole groups, a model whose attention cannot be
    grouped, a posenc attention method, a position scheme that spreads ids; LongCE: a model with absolute
    positions, a window that leaves no token a shorter context), else what they resolve to."""
    train = cfg.train
    group = None
    if train.attention == "s2":
        from .. import s2_attention

        where = "train.attention=s2"
        if train.objective != "lm":
            raise ConfigError(f"{where} trains a causal LM on long sequences (objective lm); distill matches the "
                              f"unpatched model inside its original context")
        if train.loss == "longce":
            raise ConfigError(f"{where} and train.loss=longce do not go together: LongCE weighs each token by how "
                              f"much the whole window helps it, but under S2-Attn the training forward sees only "
                              f"groups of tokens; use one or the other")
        if cfg.posenc:
            from ..config import AttentionMethodConfig
            from ..registry import get_method

            method = cfg.posenc["method"]
            if issubclass(get_method(method), AttentionMethodConfig):
                raise ConfigError(f"{where} cannot train posenc method {method!r}: it is an attention method (it "
                                  f"computes attention or its positions itself), which S2-Attn would replace; "
                                  f"use a RoPE method (yarn, ntk, linear, ...) or train.attention=full")
        why = s2_attention.why_not_groupable(model, train.s2_shift)
        if why:
            raise ConfigError(f"{where} cannot train {ref!r}: {why}")
        if positions.spreads:
            raise ConfigError(f"{where} groups attention over consecutive tokens, but train.positions="
                              f"{train.positions!r} spreads a window's ids so that its long distances lie between "
                              f"its chunks, which the groups cut apart; use S2 on contiguous windows of the "
                              f"target length, or the position scheme with full attention")
        group = train.s2_group or seq_len // 4
        default = "" if train.s2_group else " (its default: a quarter of data.seq_len)"
        for name, length in (("data.seq_len", seq_len), ("data.short_len", short_len)):
            if length is None:
                continue
            try:
                s2_attention.check_group(group, length, train.s2_shift)
            except PosEncError as err:
                raise ConfigError(f"train.s2_group={group}{default}: {err} ({name}={length})") from None
    longce = None
    if train.loss == "longce":
        from .. import api
        from ..losses import LongCE

        where = "train.loss=longce"
        if train.objective != "lm":
            raise ConfigError(f"{where} weights a causal LM's next-token loss (objective lm), got train.objective="
                              f"{train.objective!r}")
        mechanism = api.describe(model)["mechanism"]
        if mechanism not in ("rope", "bias"):
            raise ConfigError(f"{where} compares each token's loss given a short window at the same positions with "
                              f"its loss given everything, which only relative positions (RoPE, a bias) read as "
                              f"less context; this model's positions are {mechanism!r} (a learned table: one "
                              f"absolute row per position); patch it to rope first (posenc: {{method: rope}}) or "
                              f"use train.loss=ce")
        window = train.longce_window or original
        stride = train.longce_stride or window
        if window + stride >= seq_len:
            said = "" if train.longce_window else f" (its default: the original context)"
            raise ConfigError(f"train.longce_window={window}{said} + train.longce_stride={stride} must be below "
                              f"data.seq_len={seq_len}: only a token after window + stride tokens has a shorter "
                              f"context to compare; lower train.longce_window")
        longce = LongCE(window, stride, float(train.longce_clip), float(train.longce_floor))
    return LongTraining(group, train.s2_shift, longce)


def enable_s2(model, long: Optional[LongTraining]) -> None:
    """S2-Attn on `model` (a PEFT wrapper too) for the training forwards, when the run asks for it."""
    if long is not None and long.s2_group:
        from .. import s2_attention

        s2_attention.enable(model, long.s2_group, long.s2_shift)


def disable_s2(model) -> None:
    """Full attention again, before the model is saved and evaluated after training."""
    from .. import s2_attention

    s2_attention.disable(model)
