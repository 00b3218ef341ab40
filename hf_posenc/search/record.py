"""What a factor search records and how a killed one resumes: `SearchSettings` (what makes two searches the same),
search.json and candidates.jsonl read back strictly (an edited or foreign line refused, naming the file and line),
each candidate marked with the search's identity (settings, text, weights), and one search a folder at a time."""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import math
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from ..config import MAX_POSITIONS, check_number
from ..errors import ConfigError, InvalidInputError, InvalidParameterError
from ..eval import recall
from ..export.serving import whole_file
from .factors import MODES, FactorSpace

MAX_BUDGET = 100000   # CMA-ES candidates a search takes at most
MIN_PASSAGES = 2      # the fitness's passages: its repeats' interval needs two

@dataclass
class SearchSettings:
    """What makes two searches the same search: a resume with any of these changed is refused naming it."""

    model: str
    target: int
    original: int
    mode: str = "switched"
    budget: int = 24                 # candidates after the seeds
    passages: int = 24
    passage_tokens: int = 192
    far_from: int | None = None      # None: the original context
    guard_length: int = 2048
    guard_share: float = 0.01
    top_range: list[float] = field(default_factory=lambda: [0.75, 2.0])
    attention_range: list[float] | None = field(default_factory=lambda: [1.0, 1.3])
    sigma: float = 0.25
    population: int = 0              # 0: CMA-ES's default, 4 + 3 ln(dims)
    seed: int = 0
    corpus: str = "shakespeare"
    dtype: str = "float32"
    band_width: int | None = None    # None: one pool past `far`; else passages spread evenly over bands of this width
    critical_floor: bool | float = False   # pairs past the critical one get at least s (true) or this multiple of s
    race: bool = False               # score the first sequence, stop a candidate it shows clearly worse than the best

    def __post_init__(self) -> None:
        check_number("target", self.target, minimum=2, maximum=MAX_POSITIONS, integer=True, optional=False)
        check_number("original", self.original, minimum=1, integer=True, optional=False)
        if self.target <= self.original:
            raise InvalidParameterError(f"target {self.target} must be longer than the model's original context "
                                        f"{self.original}: there is nothing to extend")
        if self.mode not in MODES:
            raise InvalidParameterError(f"mode must be one of {', '.join(MODES)}, got {self.mode!r}")
        check_number("budget", self.budget, minimum=0, maximum=MAX_BUDGET, integer=True, optional=False)
        check_number("passages", self.passages, minimum=MIN_PASSAGES, integer=True, optional=False)
        check_number("far_from", self.far_from, minimum=0, maximum=self.target - 1, integer=True)
        check_number("guard_length", self.guard_length, minimum=2, maximum=self.original, integer=True,
                     optional=False)
        check_number("guard_share", self.guard_share, minimum=0, maximum=1, optional=False)
        check_number("sigma", self.sigma, above=0, maximum=1, optional=False)
        check_number("population", self.population, minimum=0, maximum=1000, integer=True, optional=False)
        check_number("seed", self.seed, minimum=0, maximum=2**32 - 1, integer=True, optional=False)   # numpy's range
        for name in ("top_range", "attention_range"):
            value = getattr(self, name)
            if not (isinstance(value, (list, tuple)) or (value is None and name == "attention_range")):
                raise InvalidParameterError(f"{name} must be [low, high]"
                                            f"{' or None' if name == 'attention_range' else ''}, got {value!r}")
        if 0 < self.population < 4:   # CMA-ES recombines the best half: 2 at least
            raise InvalidParameterError(f"population must be 0 (CMA-ES's default) or >= 4, got {self.population}")
        if not isinstance(self.race, bool):
            raise InvalidParameterError(f"race must be true or false, got {self.race!r}")
        if not isinstance(self.critical_floor, bool):
            if not isinstance(self.critical_floor, (int, float)) or not 1 <= self.critical_floor < math.inf:
                raise InvalidParameterError(f"critical_floor must be true, false or a multiple of s = target / "
                                            f"original, >= 1, got {self.critical_floor!r}")
        check_number("band_width", self.band_width, minimum=self.passage_tokens, integer=True)
        if self.band_width is not None and self.band_width > self.target - self.far:
            raise InvalidParameterError(
                f"band_width {self.band_width} is wider than the distances it bands ({self.far} to the target "
                f"{self.target}: {self.target - self.far} tokens): use at most {self.target - self.far}")
        per_sequence, sequences = recall.cell_sequences(self.target, self.passages, self.passage_tokens)
        if self.band_width is not None and per_sequence < 2 * len(self.bands):
            raise InvalidParameterError(
                f"{len(self.bands)} bands of {self.band_width} tokens need 2 passages each in every sequence; a "
                f"sequence holds {per_sequence} of the {self.passages} passages: use more passages or wider bands")
        if self.race and sequences < 2:
            raise InvalidParameterError(
                f"race scores the first of several sequences, but {self.passages} passages of {self.passage_tokens} "
                f"tokens fit in one {self.target}-token sequence: use at least {2 * per_sequence} passages, or no race")
        self.space(critical=0)   # the bounds (and the floor against the top), checked by the space itself
        self.layout(head=1)

    @property
    def sequence_passages(self) -> int:
        return recall.cell_sequences(self.target, self.passages, self.passage_tokens)[0]

    @property
    def far(self) -> int:
        return self.original if self.far_from is None else self.far_from

    @property
    def bands(self) -> list[tuple[int, int]]:
        """The distance bands the fitness weighs alike, [from, to) from `far` to the target (one band unbanded)."""
        width = self.band_width or self.target - self.far
        edges = list(range(self.far, self.target, width))
        return [(a, min(a + width, self.target)) for a in edges]

    def band_distances(self, head: int) -> list[int]:
        """The distance of each passage of a sequence: as evenly as they go over the bands, the far bands first
        to get a passage more, each band's passages evenly inside it (the longest distance a sequence holds
        caps the last band)."""
        bands, count = self.bands, self.sequence_passages
        longest = self.target - head - self.passage_tokens
        out = []
        for b, (low, high) in enumerate(bands):
            k = count // len(bands) + (1 if len(bands) - b <= count % len(bands) else 0)
            low, high = max(low, self.passage_tokens), min(high, longest)
            out += [int(low + (j + 0.5) * (high - low) / k) for j in range(k)]
        return out

    def layout(self, head: int = 0) -> recall.Layout:
        """Where the passages sit (the same for every candidate), refused when none lies `far` back."""
        distances = None if self.band_width is None else self.band_distances(head)
        layout = recall.plan_layout(self.target, passages=self.sequence_passages, passage_tokens=self.passage_tokens,
                                    distances=distances, head=head, seed=self.seed)
        if not any(d >= self.far for d in layout.distances):
            raise InvalidParameterError(
                f"far_from {self.far}: no passage of a {self.target}-token sequence lies that far back (the longest "
                f"distance is {max(layout.distances)}); use a shorter far_from or a longer target")
        return layout

    def recall_sets(self, tokenizer, text_ids: Sequence[int], prefix: Sequence[int] = ()) -> list[recall.RecallSet]:
        """The recall sequences every candidate is scored on (refused when the text is too short for them)."""
        sequences = recall.cell_sequences(self.target, self.passages, self.passage_tokens)[1]
        return recall.make_recall(tokenizer, text_ids, self.layout(head=len(prefix)), sequences=sequences,
                                  seed=self.seed, prefix=prefix)

    @property
    def floor(self) -> float | None:
        """The critical pairs' floor in multiples of s (true: 1), or None (no floor)."""
        if isinstance(self.critical_floor, bool):
            return 1.0 if self.critical_floor else None
        return float(self.critical_floor)

    @property
    def floor_factor(self) -> float | None:
        """The least factor of the pairs from the critical one on (floor x s), or None (no floor)."""
        return None if self.floor is None else self.floor * self.target / self.original

    def space(self, pairs: int = 2, critical: int | None = None) -> FactorSpace:
        attention = None if self.attention_range is None else tuple(self.attention_range)
        floor_from = min(critical, pairs) if self.floor is not None and critical is not None else None
        return FactorSpace(pairs=pairs, factor=self.target / self.original, original=self.original,
                           top_range=tuple(self.top_range), attention_range=attention, floor_from=floor_from,
                           floor=self.floor or 1.0)


EXTENDABLE = ("budget",)   # a rerun may ask for more candidates (or fewer): the search replays to there


def check_resume(saved: dict, settings: dict, path: Path) -> None:
    """A search resumed with other settings would mix two searches in one record: refused naming each field. A
    field the record predates reads as its default (the search it holds ran without it)."""
    if not isinstance(saved, dict):
        raise InvalidInputError(f"{path}: its settings are not a mapping of fields (got {saved!r:.60}): the file was "
                                f"edited; move it away to start again")
    saved = _with_defaults(saved)
    differ = [k for k in sorted(set(saved) | set(settings))
              if k not in EXTENDABLE and json.dumps(saved.get(k)) != json.dumps(settings.get(k))]
    if differ:
        shown = "; ".join(f"{k}: {json.dumps(saved.get(k))} there, {json.dumps(settings.get(k))} now" for k in differ)
        raise ConfigError(f"{path} holds a search with other settings ({shown}); resume with its settings, or name "
                          f"another output folder")


def _with_defaults(settings: dict) -> dict:
    """A record's settings with each field it predates at its default (the search it holds ran without it)."""
    defaults = {f.name: f.default for f in dataclasses.fields(SearchSettings) if f.default is not dataclasses.MISSING}
    return {**{k: v for k, v in defaults.items() if k not in settings}, **settings}


IDENTITY = ("settings", "text", "weights")   # what a line of candidates.jsonl carries: the search that scored it


def candidate_identity(record: dict, path: Path) -> dict:
    """The identity every line of candidates.jsonl carries, of the search whose record (search.json at `path`, or
    FactorSearch.record) is `record`: sha256 of its settings as a resume compares them (the budget left out: a rerun
    may change it), of its text and of its weights. A record without the text's and weights' hashes, or without its
    number of rotary pairs, cannot show whose candidates it holds: refused."""
    identity, pairs = record.get("identity"), record.get("pairs")
    if not (isinstance(identity, dict) and all(isinstance(identity.get(k), str) for k in ("text", "weights"))):
        raise InvalidInputError(f"{path} has no identity (the sha256 of the text and of the weights its search "
                                f"scored, got {json.dumps(identity)[:40]}): nothing shows that its candidates were "
                                f"scored on this text and these weights, so they are not trusted; start over in a "
                                f"fresh output folder")
    if not (isinstance(pairs, int) and not isinstance(pairs, bool) and pairs >= 2):
        raise _edited(path, f"has pairs {json.dumps(pairs)[:40]}, where a search writes its model's rotary pairs "
                            f"(an integer >= 2)")
    settings = {k: v for k, v in _with_defaults(record["settings"]).items() if k not in EXTENDABLE}
    digest = hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()
    return {"settings": digest, "text": identity["text"], "weights": identity["weights"]}


def resume_record(path: Path, settings: dict) -> dict:
    """search.json of the search that `settings` resume: read, its settings checked to be these, and its identity
    there (see candidate_identity); each refused naming the file and what differs."""
    record = read_search(path)
    check_resume(record["settings"], settings, path)
    candidate_identity(record, path)
    return record


CANDIDATE_KEYS = ("index", "kind", "long_factor", "mode", "rejected", "value", "guard_rise")   # never None
RECORD_KEYS = {"settings": dict, "passages": list, "unpatched_guard_perplexity": float}   # what a resume reads


EDITED = "the file was edited or damaged; move it away to start again"


def _edited(path: Path, what: str) -> InvalidInputError:
    return InvalidInputError(f"{path} {what}: {EDITED}")


def read_search(path: Path) -> dict:
    """search.json as a search wrote it, refused naming the file and what is wrong with it (empty, cut short, not a
    JSON object, a key missing or of another kind)."""
    if not path.is_file():
        raise InvalidInputError(f"{path} is not a file: a search's search.json is")
    raw = path.read_bytes()
    if not raw.strip():
        raise _edited(path, "is empty")
    try:
        record = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise _edited(path, f"is not JSON ({type(err).__name__} at byte {getattr(err, 'pos', getattr(err, 'start', '?'))})") from None
    if not isinstance(record, dict):
        raise _edited(path, f"holds {type(record).__name__} {json.dumps(record)[:40]}, not a search's record")
    for key, kind in RECORD_KEYS.items():
        value = record.get(key)
        ok = _finite(value) and value > 0 if kind is float else isinstance(value, kind)
        if not ok:
            raise _edited(path, f"has {key} {json.dumps(value)[:40]}, where a search writes "
                                f"{'a positive number' if kind is float else 'a ' + kind.__name__}")
    return record


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _finite_numbers(value, least: float | None = None) -> bool:
    return isinstance(value, list) and bool(value) and all(_finite(v) and (least is None or v >= least) for v in value)


def _candidate_fault(row: dict) -> str | None:
    """What is wrong with a parsed line of candidates.jsonl (None: a candidate as the search writes it)."""
    missing = [k for k in CANDIDATE_KEYS if row.get(k) is None]
    if missing:
        return f"is not a candidate (no {', '.join(missing)})"
    if not isinstance(row["kind"], str) or not isinstance(row["rejected"], bool):
        return "is not a candidate (its kind or rejected is of another type)"
    for key in ("value", "guard_rise"):
        if not _finite(row[key]):
            return f"has {key} {row[key]!r}: a finite number is written there"
    if not _finite_numbers(row["long_factor"], least=1.0):
        return "has a long_factor that is not a list of finite numbers >= 1"
    if row["kind"].startswith("cma:") and not (_finite_numbers(row.get("x")) and all(0 <= v <= 1 for v in row["x"])):
        return f"has x {json.dumps(row.get('x'))[:40]}: a CMA-ES candidate's point is numbers in [0, 1]"
    if not row["rejected"] and not (_finite_numbers(row.get("losses")) and isinstance(row.get("distances"), list)
                                    and len(row["distances"]) == len(row["losses"])):
        return "has no losses and distances of its passages (finite numbers, one each)"
    return None


def read_candidates(path: Path, record: dict | None = None, *, unmarked: bool = False) -> list[dict]:
    """The candidates a search has finished, in order. A search writes each as one line of ASCII JSON and its
    newline, so only a last line with no newline can be a write a kill cut short (dropped: that candidate runs
    again); any other line that is not a candidate, bytes that are not UTF-8 text included, is refused naming the
    file and the line.

    With the search's `record` (search.json, or FactorSearch.record: what a resume reads them with), every line must
    be that search's: carry its identity (candidate_identity; a line of another search, or one written before lines
    carried it, is refused, not replayed), one factor for each of its rotary pairs, and a point of its form.
    `unmarked`: a line with no identity is taken as the record's, for a reader that says so (bench_search.py
    --transfer --unmarked-candidates: the records committed before lines carried one). Without a record: the lines
    as written (a finished search's figure and summary)."""
    if not path.exists():
        return []
    if not path.is_file():
        raise InvalidInputError(f"{path} is not a file: a search's candidates.jsonl is")
    identity = None if record is None else candidate_identity(record, path.with_name("search.json"))
    out = []
    lines = path.read_bytes().split(b"\n")   # the last: empty after a final newline, or a line with none
    for number, raw in enumerate(lines, 1):
        last = number == len(lines)
        try:
            row = json.loads(raw.decode("utf-8"), parse_constant=_no_constant)
        except UnicodeDecodeError as err:
            raise _edited(path, f"line {number} is not JSON: it holds bytes that are not UTF-8 text (at byte "
                                f"{err.start} of the line; a search writes ASCII)") from None
        except ValueError:   # not JSON (json.JSONDecodeError), or a NaN or Infinity
            if last:
                continue   # a killed write (or nothing after the final newline): that candidate runs again
            raise InvalidInputError(f"{path} line {number} is not JSON (only a last line with no newline after it "
                                    f"can be a write a kill cut short): the file was edited; move it away to start "
                                    f"again") from None
        fault = _candidate_fault(row) if isinstance(row, dict) else f"is not a candidate (it holds {type(row).__name__})"
        if fault:
            raise _edited(path, f"line {number} {fault}")
        stranger = None if record is None else _not_of_search(row, identity, record, unmarked)
        if stranger:
            raise InvalidInputError(f"{path} line {number} {stranger}")
        if row.get("index") != len(out):
            raise InvalidInputError(f"{path} line {number}: candidate {row.get('index')} where {len(out)} was due: "
                                    f"the file was edited; move it away to start again")
        out.append(row)
    return out


def _not_of_search(row: dict, identity: dict, record: dict, unmarked: bool) -> str | None:
    """Why a parsed line is not a candidate of the search `record` holds, and what to do (None: it is one); the
    caller names the file and the line (read_candidates)."""
    fresh = "start over in a fresh output folder"
    mark = row.get("identity")
    if mark is None and not unmarked:
        return (f"carries no identity of the search that scored it (the sha256 of its settings, text and weights; "
                f"lines written before candidates carried it have none): nothing shows it is this search's, so it is "
                f"not replayed; {fresh}")
    if mark is not None and mark != identity:
        theirs = mark if isinstance(mark, dict) else {}
        differ = [k for k in IDENTITY if theirs.get(k) != identity[k]]
        shown = "; ".join(f"{k} sha256 {str(theirs.get(k))[:12]} there, {identity[k][:12]} now" for k in differ)
        return (f"was scored by another search, of other {' and '.join(differ)} ({shown}): a line copied from "
                f"another record is not replayed; {fresh}")
    pairs, factors = record["pairs"], len(row["long_factor"])
    if factors != pairs:
        return f"has {factors} factors in long_factor, where the search's model has {pairs} rotary pairs: {EDITED}"
    dims = 4 if _with_defaults(record["settings"])["attention_range"] is None else 5
    if row.get("x") is not None and len(row["x"]) != dims:
        return (f"has {len(row['x'])} numbers in x, where a point of the search's form has {dims} (start, width, "
                f"top, shape{', attention' if dims == 5 else ''}): {EDITED}")
    return None


def _no_constant(name: str):
    raise ValueError(f"{name} is not a number a search writes")


def write_whole(path: Path, text: str) -> None:
    """`text` into `path` whole or not at all: a kill leaves the old file or none, never half of it."""
    with whole_file(path) as tmp:
        tmp.write_text(text)


def text_identity(ids: Sequence[int]) -> str:
    """sha256 of the token ids a search scores on: a resume on another text (an edited file of the same length
    included) is refused, never mixed into one record."""
    return hashlib.sha256(np.asarray(ids, dtype=np.int64).tobytes()).hexdigest()


def weights_identity(model: torch.nn.Module) -> str:
    """sha256 of the model's stored weights as loaded (names and bytes; the rope is not among them)."""
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def keep_finished(path: Path, rows: list[dict]) -> None:
    """The file holds exactly `rows`: a line a kill cut short is dropped before the next one is appended."""
    text = "".join(json.dumps(r, allow_nan=False) + "\n" for r in rows)
    if path.exists() and path.read_bytes() != text.encode():
        write_whole(path, text)


def append_candidate(path: Path, row: dict) -> None:
    """One candidate as one line, on disk before the next starts (a kill loses no finished candidate)."""
    text = json.dumps(row, allow_nan=False) + "\n"
    with open(path, "a") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())


OUTPUTS = ("search.json", "candidates.jsonl")   # what FactorSearch.run writes in its folder
_HELD: set[Path] = set()   # the folders whose lock this process holds


@contextlib.contextmanager
def only_search(folder: str | os.PathLike, outputs: Sequence[str] = OUTPUTS):
    """One search at a time in a folder (a second one would append the same candidates again): refused while
    another holds its lock. Once it holds it, the temporaries a killed search left of `outputs` there (a file
    written whole's `.NAME.tmp*`, a folder replaced whole's `.NAME.tmp-*` and `.NAME.old-*`) are removed: every
    search writes them under this lock, so no running one is writing them. Taken again inside (the recipe holds it
    across the search and the saving of best/), it is the same hold."""
    folder = Path(folder).resolve()
    if folder in _HELD:
        yield
        return
    folder.mkdir(parents=True, exist_ok=True)
    try:
        import fcntl
    except ImportError:   # not POSIX: no lock, as before, and nothing removed (its writer may be running)
        yield
        return
    with open(folder / ".lock", "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            raise ConfigError(f"another search is running in {folder}: wait for it, or name another output "
                              f"folder") from None
        _HELD.add(folder)
        try:
            for name in outputs:
                for stale in (*folder.glob(f".{name}.tmp*"), *folder.glob(f".{name}.old-*")):
                    if stale.is_dir() and not stale.is_symlink():
                        shutil.rmtree(stale, ignore_errors=True)
                    else:
                        stale.unlink(missing_ok=True)
            yield
        finally:
            _HELD.discard(folder)
