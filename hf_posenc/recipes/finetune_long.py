"""The fine-tune recipe's long-context training options: shifted sparse attention in training
(`train.attention: s2`, hf_posenc/train/s2_attention.py; Chen et al., ICLR 2024, "LongLoRA") and the long-context
loss (`train.loss`: a loss of hf_posenc.train.losses.LOSSES, `ce` or `longce`: LongCE, Fang et al., ICLR 2025), mixed
context windows (`train.mixed_windows`, hf_posenc/train/mixed_windows.py) and documents kept apart (`data.packing:
documents`, hf_posenc/train/documents.py). Their names are checked with the config (TrainArgs), the loss's settings
(`train.<loss>_<parameter>`) by the loss itself against the model's skeleton and the run's windows before anything
loads (`check_long_training`, `check_mixed_windows`, `check_documents`, called by finetune_checks.check_config),
and what they resolve to (`LongTraining`, kept in the Preflight) sets up the model
and the loss (finetune_recipe.py). Nothing here names a loss: a loss registered in hf_posenc/train/losses.py is a value
of train.loss as it is.

S2-Attn trains only: the saved model and every evaluation use full attention (s2_attention.disable before
the save; the function itself runs SDPA over everything in eval mode)."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Optional

from ..errors import ConfigError, PosEncError

if TYPE_CHECKING:
    from ..train.losses import TrainLoss
    from ..train.positions import PositionScheme
    from .finetune_config import FinetuneConfig, TrainArgs


def loss_settings(train: TrainArgs, loss: type[TrainLoss]) -> dict:
    """The values of train.<loss>_<parameter> by parameter, for each parameter the config has a field for."""
    return {f.name: getattr(train, f"{loss.name}_{f.name}") for f in dataclasses.fields(loss)
            if hasattr(train, f"{loss.name}_{f.name}")}


def unused_settings(train: TrainArgs) -> list[str]:
    """The s2_* / <loss>_* settings this run sets away from their defaults without the attention / loss that
    reads them ("train.longce_floor=1 (train.loss is ce)"): said on the run's summary, so that an option
    given without its switch is not silently a plain run."""
    from ..train.losses import LOSSES

    defaults = {f.name: f.default for f in dataclasses.fields(train)}
    off = {"s2_": (train.attention != "s2", f"train.attention is {train.attention}"),
           **{f"{name}_": (train.loss != name, f"train.loss is {train.loss}") for name in LOSSES}}
    return [f"train.{name}={getattr(train, name)} ({why})" for name in defaults
            for prefix, (unused, why) in off.items()
            if name.startswith(prefix) and unused and getattr(train, name) != defaults[name]]


@dataclasses.dataclass(frozen=True)
class LongTraining:
    """What train.attention, train.loss, train.mixed_windows and data.packing resolve to for this run."""
    s2_group: Optional[int] = None   # S2-Attn's tokens per group; None: full attention in training
    s2_shift: bool = True
    loss: Optional[TrainLoss] = None   # the resolved train.loss (None: the plain loss, as for distill)
    mixed_share: float = 0.0         # train.mixed_windows
    switched: Optional[dict] = None  # mixed windows: the longrope patch trained and saved (train/mixed_windows.py)
    short_tokens: Optional[int] = None   # mixed windows: the tokens of a short micro-batch
    document_mask: Optional[str] = None   # data.packing=documents: what keeps them apart (documents.mask_kind)

    def describe(self) -> str:
        """One line for the model card and the run's summary."""
        if self.s2_group:
            attention = (f"S2-Attn (LongLoRA) in training: attention inside groups of {self.s2_group} tokens"
                         + (f", half the heads on the groups shifted by {self.s2_group // 2}" if self.s2_shift
                            else ", no shift") + "; the saved model uses full attention")
        else:
            attention = "full attention"
        parts = [attention, self.loss.describe() if self.loss else "cross-entropy"]
        if self.switched:
            parts.append(f"mixed windows: {self.mixed_share:.0%} of the micro-batches {self.short_tokens} tokens "
                         f"inside the original context with the short rope, the rest with the long rope, as a "
                         f"switched longrope (attention factor {self.switched.get('attention_factor', 'default')})")
        if self.document_mask:
            parts.append(f"documents kept apart ({self.document_mask})")
        return "; ".join(parts)

    @property
    def said(self) -> bool:
        """Whether the run's summary line names it (the plain run's full attention and cross-entropy are unsaid)."""
        return bool(self.s2_group or self.switched or self.document_mask
                    or (self.loss is not None and self.loss.name != "ce"))


def check_long_training(cfg: FinetuneConfig, model, ref: str, original: int, seq_len: int,
                        short_len: Optional[int], positions: PositionScheme,
                        short_from: str = "data.short_len") -> LongTraining:
    """train.attention / train.loss against the run: refused in one line where they cannot work (S2: a group
    size that does not split every training sequence into whole groups, a model whose attention cannot be
    grouped, a posenc attention method, a position scheme that spreads ids; the loss: what its `for_run`
    refuses, LongCE's a model with absolute positions, a window that leaves no token a shorter context, S2),
    else what they resolve to."""
    train = cfg.train
    group = None
    if train.attention == "s2":
        from ..train import s2_attention

        where = "train.attention=s2"
        if train.objective != "lm":
            raise ConfigError(f"{where} trains a causal LM on long sequences (objective lm); distill matches the "
                              f"unpatched model inside its original context")
        if cfg.posenc:
            from ..attention import AttentionMethodConfig
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
        for name, length in (("data.seq_len", seq_len), (short_from, short_len)):
            if length is None:
                continue
            try:
                s2_attention.check_group(group, length, train.s2_shift)
            except PosEncError as err:
                raise ConfigError(f"train.s2_group={group}{default}: {err} ({name}={length})") from None
    from ..train.losses import LOSSES, LossRun

    loss = LOSSES[train.loss]
    resolved = loss.for_run(loss_settings(train, loss), LossRun(model, train.objective, train.attention, original,
                                                                seq_len))
    return LongTraining(group, train.s2_shift, resolved if train.objective == "lm" else None)


def check_mixed_windows(cfg: FinetuneConfig, ref: str, original: int, seq_len: int,
                        positions: PositionScheme) -> tuple[Optional[dict], Optional[int]]:
    """train.mixed_windows against the run: (the switched longrope patch, the short window's tokens), or
    (None, None) when off. Refused in one line: no patch or one with no short rope, a model with more than one
    RoPE, a pairing that cannot work (distill, data.short_share), windows that never leave the original context."""
    share = cfg.train.mixed_windows
    if not share:
        return None, None
    where = f"train.mixed_windows={share}"
    if not cfg.posenc:
        raise ConfigError(f"{where} mixes the model's own rope with a patched one: it needs a posenc patch (yarn, "
                          f"ntk, linear, llama3, longrope)")
    if cfg.train.objective != "lm":
        raise ConfigError(f"{where} trains long windows with the long rope; train.objective=distill trains inside "
                          f"the original context only: use objective lm")
    if cfg.data.short_share:
        raise ConfigError(f"{where} and data.short_share={cfg.data.short_share} both set a share of short windows: "
                          f"give one (mixed windows also switch the rope for them)")
    if not (positions.spreads or seq_len > original):
        raise ConfigError(f"{where}: every window here stays inside the original context (data.seq_len={seq_len} "
                          f"<= {original}, contiguous position ids), so none would train the long rope; spread the "
                          f"ids with train.positions (pose, cream, randomized) or raise data.seq_len")
    from .. import api, loading
    from ..train import mixed_windows

    method = cfg.posenc["method"]
    params = {k: v for k, v in cfg.posenc.items() if k != "method"}
    why = mixed_windows.why_no_short_rope(method)
    if why:
        raise ConfigError(f"{where}: {why}")
    fresh = loading.meta_model(ref, gguf_file=cfg.model.gguf_file)
    try:
        switched = mixed_windows.switched_params(fresh, method, params)
        api.patch(fresh, "longrope", **switched)   # dry-run: the patch the run trains and saves
    except PosEncError as err:
        raise ConfigError(f"{where} on {ref!r}: {err}") from None
    return switched, min(seq_len, original)


def check_documents(cfg: FinetuneConfig, model, causal: bool, positions: PositionScheme,
                    backend: str) -> Optional[str]:
    """data.packing=documents against the run (`backend`: the attention implementation it resolves to): what
    keeps the documents apart (for the summary line), or None when the documents are joined. Refused in one line
    where it cannot work."""
    if cfg.data.packing != "documents":
        return None
    where = "data.packing=documents"
    if not causal or cfg.train.objective != "lm":
        raise ConfigError(f"{where} keeps a causal LM's packed documents apart (objective lm); "
                          f"train.objective={cfg.train.objective} of a {'causal LM' if causal else 'non-causal model'} "
                          f"reads its inputs whole: use data.packing=joined")
    if cfg.train.attention == "s2":
        raise ConfigError(f"{where} needs the attention to mask documents; train.attention=s2 computes grouped "
                          f"attention of its own: use train.attention=full")
    if cfg.posenc:
        from ..attention import AttentionMethodConfig
        from ..registry import get_method

        if issubclass(get_method(cfg.posenc["method"]), AttentionMethodConfig):
            raise ConfigError(f"{where} needs the attention to mask documents; posenc method "
                              f"{cfg.posenc['method']!r} computes attention itself, without that mask: use a RoPE "
                              f"method or data.packing=joined")
    if cfg.train.mixed_windows:
        raise ConfigError(f"{where} with train.mixed_windows={cfg.train.mixed_windows}: a window's rope would follow "
                          f"its longest document (the ids restart at each), not the share drawn: give one")
    from ..train import documents

    try:
        documents.check_model(model.config.get_text_config().model_type, backend, cfg.train.batch_size)
    except PosEncError as err:
        raise ConfigError(f"{where} with model.attn_implementation={cfg.model.attn_implementation!r}: {err}") from None
    why = documents.why_not_per_document(model.config, backend)
    if positions.spreads and why:
        # transformers' own masks start a document wherever the ids jump: they would cut each document's chunks apart
        raise ConfigError(f"{where} with train.positions={cfg.train.positions!r} spreads the ids inside each document, "
                          f"which only hf_posenc's attention per document reads as one document (transformers' "
                          f"masks start a new one at every jump); here {why}: use model.attn_implementation=sdpa "
                          f"on a model without sliding windows, or contiguous positions")
    return documents.mask_kind(backend, model.config)
