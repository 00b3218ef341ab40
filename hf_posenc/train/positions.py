"""Position schemes: the position ids a fine-tune gives each training window, so that a short window teaches
the distances of a longer target context ("train long on short"). Training memory follows the window; the
distances the model sees follow the target.

    contiguous    0, 1, ..., n-1 (what a plain fine-tune does)
    pose          PoSE (Zhu et al., ICLR 2024): the window cut into `chunks` pieces; piece i is shifted by a
                  skip u_i, u_0 = 0 <= u_1 <= ... <= target - n, each drawn uniformly above the one before
    cream         CREAM (Wu et al., NeurIPS 2024): a head at 0.., a tail ending at target-1, and the middle
                  placed between them by a truncated Gaussian, most often near the middle of the target
    randomized    randomized positional encodings (Ruoss et al., ACL 2023): n distinct ids drawn uniformly
                  from [0, target), sorted

By default (`text=window`) the tokens stay the window's own contiguous tokens and only their ids change, as
the papers train: tokens that are neighbours in the text are told they sit far apart. With `text=span` the
ids also pick the tokens: each training block is a target-long span of text, and the window holds the span's
tokens at the drawn ids (block[ids]), so every distance the model sees is the text's own and the tokens
between the chunks are left out (the training memory is still the window's). Every scheme gives ids in
[0, target), strictly increasing. `contiguous_share` keeps that share of windows at 0..n-1 (the original
context's distances keep being trained).

Draws are reproducible: the ids of a window depend only on (seed, index), so a resumed run draws the same
ids and each data-parallel rank draws those of its own windows. With transformers, always pass an
attention mask beside position ids: without one, transformers reads a jump in the ids as the start of a
new packed sequence and masks across it.

    from hf_posenc.train.positions import scheme
    pose = scheme("pose chunks=2", target=32768)
    pose.position_ids(2048, seed=0, index=7)            # one window's ids, a LongTensor of 2048
    batch = pose.add_position_ids(batch, seed=0, first_index=step * batch_size)
    collator = pose.collator(DataCollatorForLanguageModeling(tok, mlm=False))   # Trainer / TRL

    span = scheme("pose chunks=2 text=span", target=32768)   # rows of 32768 tokens in, windows of 2048 out
    batch = span.add_position_ids(spans, seed=0, first_index=step * batch_size, window=2048)
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Optional

import numpy as np
import torch

from ..config import MAX_POSITIONS, check_number
from ..named import Registry
from ..errors import InvalidInputError, InvalidParameterError, ParameterTypeError

@dataclass(frozen=True)
class PositionScheme:
    """What every scheme shares: the target context (None: the patched model's, filled by `resolve`), the
    share of windows left contiguous, and where the tokens come from (`text`: the window's own, or the ids'
    offsets in a target-long span)."""

    name: ClassVar[str]
    summary: ClassVar[str] = ""
    # Whether, over enough windows, its ids put every distance 1..target-1 in front of attention (PoSE, CREAM,
    # randomized); False for a scheme that moves the ids without spreading them (the contract checks which).
    reaches_target: ClassVar[bool] = True
    TEXTS: ClassVar[tuple[str, ...]] = ("window", "span")

    target: Optional[int] = None
    contiguous_share: float = 0.0
    text: str = "window"

    def __post_init__(self) -> None:
        check_number("target", self.target, minimum=2, maximum=MAX_POSITIONS, integer=True)
        check_number("contiguous_share", self.contiguous_share, minimum=0, maximum=1)
        if self.text not in self.TEXTS:
            raise InvalidParameterError(
                f"position scheme {self.name!r}: text={self.text!r}; text is 'window' (the window's own tokens, "
                f"their ids spread) or 'span' (the tokens at the spread ids of a target-long span of text)")
        if self.text == "span" and not self.spreads:
            raise InvalidParameterError(f"position scheme {self.name!r} keeps ids 0..n-1: text=span would train "
                                        f"the first n tokens of each span only; use text=window")

    @property
    def span(self) -> bool:
        """Whether a training row is a target-long span the window's tokens are taken from (text=span)."""
        return self.text == "span"

    @property
    def spec(self) -> str:
        """The scheme as the text that builds it ('pose chunks=3 target=32768')."""
        defaults = type(self)()
        changed = [f"{f.name}={getattr(self, f.name)}" for f in dataclasses.fields(self)
                   if getattr(self, f.name) != getattr(defaults, f.name)]
        return " ".join([self.name, *changed])

    @property
    def spreads(self) -> bool:
        """Whether the ids can leave 0..n-1 (every scheme but contiguous)."""
        return True

    def resolve(self, target: int) -> PositionScheme:
        """A copy with the target set (the patched context when the scheme names none)."""
        check_number("target", target, minimum=2, maximum=MAX_POSITIONS, integer=True, optional=False)
        return self if self.target is not None else dataclasses.replace(self, target=int(target))

    def check_window(self, window: int) -> None:
        """Refuse a window the target cannot hold."""
        if self.target is None:
            raise InvalidParameterError(f"position scheme {self.name!r} needs a target context (target=)")
        if window > self.target:
            raise InvalidParameterError(
                f"position scheme {self.spec!r}: a window of {window} tokens is longer than the target context "
                f"{self.target}; the ids must fit in [0, target): raise target or shorten the window")

    # -- the ids -------------------------------------------------------------------------------------------
    def draw(self, n: int, rng: np.random.Generator) -> np.ndarray:
        """The ids of one window of n tokens (target >= n, check_window passed): n integers strictly increasing
        in [0, target), drawn from `rng` alone (the window's own generator), so that they depend only on
        (seed, index)."""
        raise NotImplementedError

    def position_ids(self, n: int, *, seed: int, index: int) -> torch.Tensor:
        """The ids of window `index` of a run seeded `seed`, n tokens: the same for the same (seed, index).
        Every draw is checked (n integers strictly increasing in [0, target)): a scheme that draws wrong ids
        is refused at its first wrong window, before they reach a model."""
        check_number("n (the tokens of the window)", n, minimum=1, integer=True, optional=False)
        self.check_window(n)
        rng = window_rng(seed, index)
        if self.contiguous_share and rng.random() < self.contiguous_share:
            return torch.arange(n)
        return self.checked_ids(self.draw(n, rng), n, seed=seed, index=index)

    def checked_ids(self, drawn: Any, n: int, *, seed: int, index: int) -> torch.Tensor:
        """`drawn` as a LongTensor, or a one-line refusal saying how the draw broke the scheme contract."""
        ids = np.asarray(drawn)
        limit = self.target if self.spreads else n
        wrong = None
        if ids.shape != (n,):
            wrong = f"ids of shape {ids.shape} for a window of {n} tokens"
        elif not np.issubdtype(ids.dtype, np.integer):
            wrong = f"ids of dtype {ids.dtype}, not integers"
        elif n > 1 and not bool((np.diff(ids) > 0).all()):
            k = int(np.argmax(np.diff(ids) <= 0)) + 1
            wrong = (f"ids[{k}]={int(ids[k])} after ids[{k - 1}]={int(ids[k - 1])} (repeated or decreasing ids "
                     f"tell attention two tokens share a position or come in the other order)")
        elif int(ids[0]) < 0 or int(ids[-1]) >= limit:
            wrong = f"ids from {int(ids[0])} to {int(ids[-1])}, outside [0, {limit})"
        if wrong:
            raise InvalidParameterError(
                f"position scheme {self.spec!r} ({type(self).__module__}.{type(self).__qualname__}) drew {wrong} "
                f"for window {index} (seed {seed}); a scheme's draw gives n ids strictly increasing in [0, "
                f"target) (docs/ARCHITECTURE.md, Position schemes)")
        return torch.from_numpy(ids.astype(np.int64, copy=False))

    def check_draws(self, n: int, *, seed: int, windows: int = 64) -> None:
        """Draw the first `windows` windows of a run seeded `seed` (each checked by `position_ids`), so that a
        scheme that draws wrong ids is refused before a run trains, not at its first step."""
        for index in range(windows):
            self.position_ids(n, seed=seed, index=index)

    def largest_distance(self, n: int, *, seed: int, windows: int) -> int:
        """The largest distance (last id - first id) among the ids of windows 0..windows-1 of a run seeded
        `seed`, n tokens each: what such a run trained on, read from the ids it draws (the model card's
        claim)."""
        check_number("windows", windows, minimum=1, integer=True, optional=False)
        bound = (self.target if self.spreads else n) - 1
        largest = 0
        for index in range(windows):
            ids = self.position_ids(n, seed=seed, index=index)
            largest = max(largest, int(ids[-1] - ids[0]))
            if largest >= bound:
                break   # no window can reach further
        return largest

    def batch_position_ids(self, attention_mask: torch.Tensor, *, seed: int, first_index: int = 0,
                           window: Optional[int] = None, indices: Optional[list[int]] = None) -> torch.Tensor:
        """Ids for a batch (row r is window first_index + r, or indices[r]), over its real tokens (attention_mask
        1, in order; padding gets 0). With `window` (the tokens of a training window), a row with fewer real
        tokens (a short window, the corpus' last) keeps 0..n-1: short windows train the original context; a
        row with more is refused."""
        mask = check_mask(attention_mask)
        window = check_window_arg(window)
        indices = window_indices(first_index, indices, len(mask))
        ids = torch.zeros(mask.shape, dtype=torch.long)
        for row, real in enumerate(mask.bool().cpu()):
            n = int(real.sum())
            if n == 0:
                continue
            if window is not None and n > window:
                raise InvalidInputError(f"row {row} has {n} tokens, more than window={window} (the tokens of one "
                                        f"training window): cut the rows to windows, or leave window out")
            drawn = (torch.arange(n) if window is not None and n < window
                     else self.position_ids(n, seed=seed, index=indices[row]))
            ids[row, real] = drawn
        return ids.to(mask.device)

    def add_position_ids(self, batch: dict, *, seed: int, first_index: int, window: Optional[int] = None) -> dict:
        """`batch` (a dict: input_ids [rows, tokens], optionally attention_mask of the same shape) with
        position_ids added, and an attention mask of ones when it had none (transformers would otherwise read
        each jump as a new packed sequence). text=window: `window` (optional) is the tokens of a training
        window, as in `batch_position_ids`. text=span: the rows are target-long spans and `window` (required)
        the tokens kept of each: the batch comes back `window` wide, every per-token tensor (input_ids,
        attention_mask, labels, ...) taken at the ids. An unbatched row (1-D input_ids), a mask of another
        shape and rows that are not whole spans are refused, not guessed at."""
        batch = checked_batch(batch)
        if self.span:
            return self.take_windows(batch, seed=seed, first_index=first_index, window=window)
        ids = self.batch_position_ids(batch["attention_mask"], seed=seed, first_index=first_index, window=window)
        return {**batch, "position_ids": ids}

    def check_span_window(self, window: Optional[int]) -> None:
        """text=span: refuse a missing window (the tokens kept of each span) or one the target cannot hold."""
        if window is None:
            raise InvalidParameterError(f"position scheme {self.spec!r} takes windows of a span: give window= "
                                        f"(the tokens kept of each span)")
        check_window_arg(window)
        self.check_window(window)

    def take_windows(self, batch: dict, *, seed: int, first_index: int, window: Optional[int],
                     indices: Optional[list[int]] = None) -> dict:
        """text=span: row r (window first_index + r, or indices[r]) keeps its tokens at the ids drawn for a
        window of `window` tokens. Each row must be one whole span, exactly target tokens: a shorter one (the
        corpus' last) is refused, as its ids could land past its end, and so is a longer one, whose tokens
        past the span no id would ever reach."""
        self.check_span_window(window)
        batch = checked_batch(batch)
        rows, width = batch["input_ids"].shape
        indices = window_indices(first_index, indices, rows)
        lengths = batch["attention_mask"].sum(dim=1)
        if rows and width > self.target:
            raise InvalidInputError(
                f"position scheme {self.spec!r} takes each window from one span of {self.target} tokens, but the "
                f"rows hold {width}: give rows of one span each (the tokens past {self.target} would never be "
                f"used)")
        if rows and (width < self.target or bool((lengths < self.target).any())):
            row = int(torch.argmin(lengths)) if width >= self.target else 0
            raise InvalidInputError(
                f"position scheme {self.spec!r} takes its windows from spans of {self.target} tokens, but row "
                f"{row} has {min(int(lengths[row]), width)}: give whole spans (leave out the corpus' last, "
                f"shorter one)")
        ids = torch.stack([self.position_ids(window, seed=seed, index=i) for i in indices]) if rows else \
            torch.zeros(0, window, dtype=torch.long)
        ids = ids.to(batch["input_ids"].device)
        taken = {k: v.gather(1, ids) if torch.is_tensor(v) and v.dim() == 2 and v.shape[1] == width else v
                 for k, v in batch.items()}
        return {**taken, "position_ids": ids}

    def collator(self, base: Optional[Callable[[list], dict]] = None, *, seed: int = 0,
                 window: Optional[int] = None) -> PositionIdsCollator:
        """A data collator for transformers' Trainer / TRL that adds position ids to what `base` collates;
        `window` as in `add_position_ids` (text=window: rows shorter than it keep 0..n-1; text=span: rows are
        target-long spans, cut to `window` tokens at the ids)."""
        return PositionIdsCollator(self, base, seed=seed, window=window)


# -- what the batch helpers take: refused in one line, naming the argument, before anything is drawn ----------

def checked_batch(batch: Any) -> dict:
    """`batch` as a dict whose input_ids are [rows, tokens] and whose attention_mask (ones when absent) has
    their shape."""
    if not isinstance(batch, Mapping):
        raise InvalidInputError(f"batch must be a dict with input_ids [rows, tokens] (and optionally "
                                f"attention_mask), got a {type(batch).__name__}")
    ids = batch.get("input_ids")
    if not torch.is_tensor(ids):
        got = "no input_ids" if ids is None else f"input_ids of type {type(ids).__name__}"
        raise InvalidInputError(f"batch must hold input_ids as a tensor [rows, tokens], got {got} "
                                f"(keys: {', '.join(map(str, batch)) or 'none'})")
    if ids.dim() != 2:
        hint = ": one row is input_ids[None]" if ids.dim() == 1 else ""
        raise InvalidInputError(f"input_ids must be 2-D [rows, tokens], got shape {tuple(ids.shape)}{hint}")
    mask = batch.get("attention_mask")
    if mask is None:
        return {**batch, "attention_mask": torch.ones_like(ids)}
    if not torch.is_tensor(mask) or mask.shape != ids.shape:
        shape = tuple(mask.shape) if torch.is_tensor(mask) else type(mask).__name__
        raise InvalidInputError(f"attention_mask {shape} beside input_ids {tuple(ids.shape)}: the mask must be a "
                                f"tensor of input_ids' shape (one value per token)")
    return dict(batch)


def check_mask(attention_mask: Any) -> torch.Tensor:
    if not torch.is_tensor(attention_mask) or attention_mask.dim() != 2:
        got = (f"shape {tuple(attention_mask.shape)}" if torch.is_tensor(attention_mask)
               else f"a {type(attention_mask).__name__}")
        raise InvalidInputError(f"attention_mask must be a 2-D tensor [rows, tokens], got {got}")
    return attention_mask


def check_window_arg(window: Any) -> Optional[int]:
    check_number("window", window, minimum=1, maximum=MAX_POSITIONS, integer=True)
    return None if window is None else int(window)


def window_indices(first_index: Any, indices: Optional[list[int]], rows: int) -> list[int]:
    """The window number of each row: first_index + r, or the given ones."""
    if indices is not None:
        return list(indices)
    check_number("first_index", first_index, minimum=0, integer=True, optional=False)
    return [int(first_index) + r for r in range(rows)]


def window_rng(seed: int, index: int) -> np.random.Generator:
    """The generator of window `index` in a run seeded `seed` (numpy's SeedSequence mixes both)."""
    check_number("seed", seed, minimum=0, integer=True, optional=False)
    check_number("index", index, minimum=0, integer=True, optional=False)
    return np.random.default_rng([int(seed), int(index)])


SCHEMES = Registry("position scheme", PositionScheme, setting="train.positions", decorator="register_scheme",
                   dataclass=True)


def register_scheme(cls: type[PositionScheme]) -> type[PositionScheme]:
    """Class decorator: make `cls` a scheme `scheme()` builds by its `name` (docs/ARCHITECTURE.md, "Position
    schemes"). A name already taken is refused, naming both classes."""
    return SCHEMES.register(cls)


@register_scheme
@dataclass(frozen=True)
class Contiguous(PositionScheme):
    name: ClassVar[str] = "contiguous"
    summary: ClassVar[str] = "0, 1, ..., n-1: the plain fine-tune"

    @property
    def spreads(self) -> bool:
        return False

    def check_window(self, window: int) -> None:
        pass   # no target involved

    def draw(self, n, rng):
        return np.arange(n)


@register_scheme
@dataclass(frozen=True)
class Pose(PositionScheme):
    """PoSE: `chunks` pieces of random lengths (cut points uniform, each piece >= 1 token); piece i's ids
    are shifted by u_i, with u_0 = 0 and u_i drawn uniformly from [u_{i-1}, target - n]."""

    name: ClassVar[str] = "pose"
    summary: ClassVar[str] = "PoSE (Zhu et al. 2024): chunks shifted by growing random skips"
    chunks: int = 2

    def __post_init__(self) -> None:
        super().__post_init__()
        check_number("chunks", self.chunks, minimum=1, maximum=1024, integer=True)

    def check_window(self, window: int) -> None:
        super().check_window(window)
        if window < self.chunks:
            raise InvalidParameterError(f"position scheme {self.spec!r}: a window of {window} tokens cannot be cut "
                                        f"into {self.chunks} chunks")

    def draw(self, n, rng):
        room = self.target - n
        cuts = np.sort(rng.choice(np.arange(1, n), size=self.chunks - 1, replace=False)) if self.chunks > 1 \
            else np.array([], dtype=np.int64)
        lengths = np.diff(np.concatenate([[0], cuts, [n]]))
        skips = [0]
        for _ in range(self.chunks - 1):
            skips.append(int(rng.integers(skips[-1], room + 1)))
        return np.arange(n) + np.repeat(skips, lengths)


@register_scheme
@dataclass(frozen=True)
class Cream(PositionScheme):
    """CREAM: the window of n tokens is a head of h, a middle of m and a tail of t tokens (h = t). The head
    keeps ids 0..h-1 and the tail ends at target-1 (t ids); the middle keeps its m ids contiguous, placed
    by a scale c in [1, f] (f = target / n) drawn from a Gaussian of mean (1 + f) / 2 and std sigma / 2
    truncated to [1, f]: the middle's last id is drawn uniformly in [h + (m-1) c, c n - t - 1].
    Each window is, with probability `continuity`, a continuity window (h = t = k: short ends, a long
    middle, distances close to the ends' continuous) or else a relativity window (h = t = n // 3: long
    ends, distances spread over the target). k defaults to 4 f, the released code's choice; the code
    discretises c on a grid, which is left out here."""

    name: ClassVar[str] = "cream"
    summary: ClassVar[str] = "CREAM (Wu et al. 2024): head at 0, tail at the target's end, Gaussian middle"
    sigma: float = 3.0
    continuity: float = 0.5
    k: Optional[int] = None

    def __post_init__(self) -> None:
        super().__post_init__()
        check_number("sigma", self.sigma, above=0, maximum=1e6)
        check_number("continuity", self.continuity, minimum=0, maximum=1)
        check_number("k", self.k, minimum=1, maximum=MAX_POSITIONS, integer=True)

    def ends(self, n: int) -> tuple[int, int]:
        """(k, n // 3): the head (= tail) length of a continuity window and of a relativity window."""
        k = self.k if self.k is not None else max(1, round(4 * self.target / n))
        return min(k, (n - 1) // 2), n // 3

    def check_window(self, window: int) -> None:
        super().check_window(window)
        if window < 3:
            raise InvalidParameterError(f"position scheme {self.spec!r}: a window needs >= 3 tokens (head, middle, "
                                        f"tail), got {window}")

    def draw(self, n, rng):
        continuity, relativity = self.ends(n)
        h = t = continuity if rng.random() < self.continuity else relativity
        m = n - h - t
        f = self.target / n
        c = truncated_normal(rng, (1 + f) / 2, self.sigma / 2, 1.0, f)
        low = h + math.floor((m - 1) * c)
        high = max(low, math.floor(c * n) - t - 1)
        end = int(rng.integers(low, min(high, self.target - t - 1) + 1))
        return np.concatenate([np.arange(h), np.arange(end - m + 1, end + 1), np.arange(self.target - t, self.target)])


def truncated_normal(rng: np.random.Generator, mean: float, std: float, low: float, high: float) -> float:
    """One draw of N(mean, std) restricted to [low, high], by inverting the CDF over that range."""
    if high <= low:
        return low
    lo, hi = (_normal_cdf((x - mean) / std) for x in (low, high))
    u = lo + (hi - lo) * rng.random()
    return float(min(max(mean + std * _normal_ppf(u), low), high))


def _normal_cdf(z: float) -> float:
    return 0.5 * math.erfc(-z / math.sqrt(2))


def _normal_ppf(p: float) -> float:
    """The standard normal quantile (bisection on erfc: exact to 1e-12, no scipy)."""
    p = min(max(p, 1e-300), 1 - 1e-16)
    lo, hi = -40.0, 40.0
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if _normal_cdf(mid) < p else (lo, mid)
    return (lo + hi) / 2


@register_scheme
@dataclass(frozen=True)
class Randomized(PositionScheme):
    """Randomized positional encodings: n distinct ids drawn uniformly from [0, target), sorted."""

    name: ClassVar[str] = "randomized"
    summary: ClassVar[str] = "randomized (Ruoss et al. 2023): sorted distinct ids drawn from [0, target)"

    def draw(self, n, rng):
        return np.sort(rng.choice(self.target, size=n, replace=False))


# -- building a scheme from text ----------------------------------------------------------------------------

def scheme(spec: str | PositionScheme, *, target: Optional[int] = None, **params: Any) -> PositionScheme:
    """A scheme from its text ("pose chunks=3 contiguous_share=0.1"), a name and keyword parameters, or a
    scheme (a copy with `params` changed); `target` fills the target context where the text names none.
    Unknown names and parameters are refused with what exists."""
    if isinstance(spec, PositionScheme):
        cls, given = type(spec), params
    else:
        name, parsed = SCHEMES.parse(spec)   # an unknown name refused, the known ones listed
        cls, given = SCHEMES[name], {**parsed, **params}
    allowed = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(given) - set(allowed))
    if unknown:
        raise InvalidParameterError(f"position scheme {cls.name!r} has no parameter(s) {unknown}; its parameters: "
                                    f"{', '.join(allowed)}")
    built = (dataclasses.replace(spec, **given) if given else spec) if isinstance(spec, PositionScheme) \
        else cls(**given)
    return built.resolve(target) if target is not None else built


class PositionIdsCollator:
    """Collates with `base` (default: stack the rows' equal-length input_ids; their other keys are left out),
    then adds position ids drawn from a key of each row's tokens: the same window gets the same ids in every
    epoch, on every rank, after a resume, without a counter (which Trainer's dataloader workers would copy).
    Rows keep their attention mask (one of ones when `base` gives none). `window` as in
    `PositionScheme.add_position_ids`. An empty batch, rows that are not dicts with input_ids, and rows of
    different lengths without a `base` to pad them are refused naming the row."""

    def __init__(self, scheme: PositionScheme, base: Optional[Callable[[list], dict]] = None, *, seed: int = 0,
                 window: Optional[int] = None):
        if not isinstance(scheme, PositionScheme):
            raise ParameterTypeError(f"scheme must be a PositionScheme (positions.scheme('pose')), got "
                                     f"{type(scheme).__name__}")
        if scheme.spreads and scheme.target is None:
            raise InvalidParameterError(f"position scheme {scheme.name!r} needs a target context (target=)")
        if base is not None and not callable(base):
            raise ParameterTypeError(f"base must be a collator (a callable taking a list of rows), got "
                                     f"{type(base).__name__}")
        check_number("seed", seed, minimum=0, integer=True, optional=False)
        if scheme.span:
            scheme.check_span_window(window)
        self.scheme, self.base, self.seed, self.window = scheme, base, seed, check_window_arg(window)
        if scheme.spreads and window is not None and not scheme.span:
            scheme.check_window(window)

    def __call__(self, rows: list) -> dict:
        if not isinstance(rows, (list, tuple)) or not rows:
            got = "an empty batch" if isinstance(rows, (list, tuple)) else f"a {type(rows).__name__}"
            raise InvalidInputError(f"the collator takes a list of one or more rows (dicts with input_ids), got "
                                    f"{got}")
        batch = checked_batch(self.base(rows) if self.base else stack_rows(rows))
        keys = [int.from_bytes(hashlib.blake2b(tokens[mask].cpu().numpy().tobytes(), digest_size=7).digest(),
                               "little")
                for tokens, mask in zip(batch["input_ids"], batch["attention_mask"].bool())]
        if self.scheme.span:
            return self.scheme.take_windows(batch, seed=self.seed, first_index=0, window=self.window, indices=keys)
        batch["position_ids"] = self.scheme.batch_position_ids(batch["attention_mask"], seed=self.seed,
                                                               window=self.window, indices=keys)
        return batch


def stack_rows(rows: list) -> dict:
    """The rows' input_ids as one [rows, tokens] tensor, when every row is a dict of one list of token ids and
    they have one length (padding needs a tokenizer: a base collator's work)."""
    tensors = []
    for i, row in enumerate(rows):
        if not isinstance(row, Mapping):
            raise InvalidInputError(f"row {i} is a {type(row).__name__}: the collator's rows are dicts with "
                                    f"input_ids ({{'input_ids': [...]}})")
        if "input_ids" not in row:
            raise InvalidInputError(f"row {i} has no input_ids (its keys: {', '.join(map(str, row)) or 'none'})")
        try:
            tokens = torch.as_tensor(row["input_ids"])
        except (TypeError, ValueError, RuntimeError):
            tokens = None
        if tokens is None or tokens.dim() != 1 or tokens.is_floating_point() or tokens.dtype == torch.bool:
            raise InvalidInputError(f"row {i}'s input_ids must be one list of token ids, got "
                                    f"{str(row['input_ids'])[:60]!r}")
        tensors.append(tokens)
    lengths = [len(t) for t in tensors]
    if len(set(lengths)) > 1:
        other = next(i for i, n in enumerate(lengths) if n != lengths[0])
        raise InvalidInputError(f"row 0 has {lengths[0]} tokens and row {other} {lengths[other]}, and the collator "
                                f"has no base collator to pad them: give one (collator(DataCollatorForLanguage"
                                f"Modeling(tok, mlm=False))) or rows of one length")
    return {"input_ids": torch.stack(tensors)}


def relative_distances(ids: torch.Tensor) -> torch.Tensor:
    """The distances id_j - id_i (i < j) one window's ids put in front of attention (for checks and plots)."""
    ids = ids.flatten()
    diff = ids[None, :] - ids[:, None]
    return diff[torch.triu(torch.ones_like(diff, dtype=torch.bool), diagonal=1)]


__all__ = ["PositionScheme", "Contiguous", "Pose", "Cream", "Randomized", "SCHEMES", "scheme",
           "PositionIdsCollator", "register_scheme", "relative_distances", "window_rng"]
