"""Position schemes (hf_posenc/train/positions.py): the scheme contract, run on every registered scheme (the shipped
ones and docs/ARCHITECTURE.md's worked example, tests/examples/shifted_scheme.py, registered for the tests only),
each scheme against its paper, the batch helpers' refusals, and the fine-tune recipe training with them (tiny
models from config). One scheme's contract: `pytest -m contract -k <name> tests/test_positions.py`."""

import dataclasses
import re
from pathlib import Path
from types import SimpleNamespace
from typing import ClassVar
from unittest import mock

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import hf_posenc as hp
from hf_posenc.recipes import finetune_card as card
from hf_posenc.train import checkpoints as ckpt
from hf_posenc.train import positions as P
from hf_posenc.recipes.finetune_long import LongTraining
from hf_posenc.errors import ConfigError, InvalidInputError, InvalidParameterError, ParameterTypeError
from hf_posenc.train.losses import TrainingLoss
from hf_posenc.recipes import finetune_checks as checks
from hf_posenc.recipes import finetune_config as FC
from test_finetune import gpt2_dir, run_recipe, state, text_file, tiny_dir, write_config  # noqa: F401
from tiny import tiny_model, token_ids

import examples.shifted_scheme  # noqa: F401,E402  registers the worked example here (whatever conftest imports)

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "tests" / "examples" / "shifted_scheme.py"
SPREADING = [name for name in P.SCHEMES if P.scheme(name).spreads]
# the schemes an installed hf_posenc has (the worked example is registered by the tests only)
SHIPPED = [name for name, cls in P.SCHEMES.items() if cls.__module__.startswith("hf_posenc.")]


def draws(spec, n, target, count, seed=0):
    s = P.scheme(spec, target=target)
    return [s.position_ids(n, seed=seed, index=i) for i in range(count)]


# --------------------------------------------------------------------------- the scheme contract: every scheme
def test_the_worked_example_is_registered_for_the_tests_only():
    assert P.SCHEMES["shifted"].__module__ == "examples.shifted_scheme" and "shifted" not in SHIPPED
    assert set(SHIPPED) >= {"contiguous", "pose", "cream", "randomized"}


@pytest.mark.contract
@pytest.mark.parametrize("name", list(P.SCHEMES))
@pytest.mark.parametrize("n, target", [(16, 64), (5, 5), (37, 1000), (3, 4)])
def test_ids_are_in_range_strictly_increasing_and_reproducible(name, n, target):
    """n ids strictly increasing in [0, target), the same for the same (seed, index) whatever was drawn
    before, from a fresh scheme, and row r of a batch is window first_index + r."""
    got = draws(name, n, target, 300)
    for ids in got:
        assert ids.dtype == torch.long and ids.shape == (n,)
        assert int(ids.min()) >= 0 and int(ids.max()) < target
        assert bool((ids.diff() > 0).all()), ids
    fresh = P.scheme(name, target=target)
    for i in (299, 7, 0, 7, 150):                                  # any order: only (seed, index) matters
        assert torch.equal(fresh.position_ids(n, seed=0, index=i), got[i])
    batch = fresh.add_position_ids({"input_ids": torch.zeros(3, n, dtype=torch.long)}, seed=0, first_index=40)
    assert all(torch.equal(batch["position_ids"][r], got[40 + r]) for r in range(3))


@pytest.mark.contract
@pytest.mark.parametrize("name", SPREADING)
def test_the_distances_reached_are_the_ones_declared(name):
    """reaches_target: over many windows of 16 tokens, the ids put every distance 1..63 of a target of 64 in
    front of attention; a scheme declaring False (the worked example) must indeed fall short."""
    seen = torch.zeros(64, dtype=torch.bool)
    for ids in draws(name, 16, 64, 1000):
        seen[P.relative_distances(ids)] = True
    missing = torch.nonzero(~seen).flatten().tolist()
    assert (missing == [0]) == P.SCHEMES[name].reaches_target, missing[:10]


@pytest.mark.contract
@pytest.mark.parametrize("name", SPREADING)
def test_a_window_as_long_as_the_target_is_contiguous_and_seeds_differ(name):
    for ids in draws(name, 32, 32, 20):
        assert torch.equal(ids, torch.arange(32))
    a, b = draws(name, 32, 4096, 5, seed=0), draws(name, 32, 4096, 5, seed=1)
    assert any(not torch.equal(x, y) for x, y in zip(a, b))
    assert len({tuple(x.tolist()) for x in a}) == 5   # each window its own draw


@pytest.mark.contract
@pytest.mark.parametrize("name", list(P.SCHEMES))
@pytest.mark.parametrize("processes", [1, 2])
def test_the_card_claims_the_distances_the_run_drew(name, processes):
    """The model card's distance is the largest one in the ids of the run's windows (steps x grad_accum x
    batch_size x processes of them, numbered as the recipe numbers them), computed here from every pair."""
    scheme = P.scheme(name, target=256)
    cfg = SimpleNamespace(train=SimpleNamespace(grad_accum=2, batch_size=3, seed=5),
                          data=SimpleNamespace(short_share=0.0))
    preflight = SimpleNamespace(positions=scheme, seq_len=16, long_training=LongTraining())
    line = card.positions_line(preflight, cfg, steps=2, processes=processes)
    windows = 2 * 2 * 3 * processes
    drawn = max(int(P.relative_distances(scheme.position_ids(16, seed=5, index=w)).max()) for w in range(windows))
    claimed = int(re.search(r"distances up to (\d+)", line).group(1))
    assert claimed == drawn, line
    if scheme.spreads:
        assert f"its {windows} windows" in line and "the target allows 255" in line
    if name == "shifted":
        assert claimed == 15                                       # the shift moves ids, not distances


@pytest.mark.contract
@pytest.mark.parametrize("spec", [f"{name} text=span" for name in SPREADING])
def test_span_windows_hold_the_spans_tokens_at_the_ids(spec):
    """text=span draws the same ids as text=window and takes every per-token tensor of the span at them: the
    distance between two tokens of the window is their distance in the text."""
    span, window = P.scheme(spec, target=256), P.scheme(spec.replace("text=span", ""), target=256)
    spans = torch.arange(3 * 256).reshape(3, 256) + 7
    out = span.add_position_ids({"input_ids": spans, "labels": -spans, "other": "kept"}, seed=1, first_index=5,
                                window=64)
    assert out["input_ids"].shape == out["attention_mask"].shape == out["position_ids"].shape == (3, 64)
    assert bool(out["attention_mask"].all()) and out["other"] == "kept"
    for r in range(3):
        ids = window.position_ids(64, seed=1, index=5 + r)
        assert torch.equal(out["position_ids"][r], ids)
        assert torch.equal(out["input_ids"][r], spans[r, ids]) and torch.equal(out["labels"][r], -spans[r, ids])
    collated = span.collator(window=64, seed=1)([{"input_ids": row.tolist()} for row in spans[:2]])
    for r in range(2):
        assert torch.equal(collated["input_ids"][r], spans[r, collated["position_ids"][r]])
    assert not torch.equal(collated["position_ids"][0], collated["position_ids"][1])   # keyed by each span


@pytest.mark.contract
@pytest.mark.parametrize("name", list(P.SCHEMES))
def test_a_scheme_says_what_it_is_and_builds_from_its_own_spec(name):
    cls = P.SCHEMES[name]
    assert cls.summary and cls.__doc__ and cls.name == name
    built = P.scheme(name, target=4096)
    assert P.scheme(built.spec) == built                          # the text the card and the log show rebuilds it
    assert P.scheme(built, contiguous_share=0.5).contiguous_share == 0.5


@pytest.mark.contract
@pytest.mark.parametrize("name", SHIPPED)
def test_the_help_the_docs_and_readme_name_every_shipped_scheme(name):
    """What a user reads lists the registry: train.positions' help, docs/finetune.md's table of schemes and
    README's train-long-on-short paragraph."""
    help_text = FC.TrainArgs.__dataclass_fields__["positions"].metadata["help"]
    assert re.search(rf"\b{name}\b", help_text), f"train.positions' help (recipes/finetune_config.py) omits {name}"
    table = re.findall(r"^\| `(\w+)[^`]*`", (ROOT / "docs/finetune.md").read_text(), re.M)
    assert name in table, f"docs/finetune.md's table of position schemes has no row for {name}"
    readme = (ROOT / "README.md").read_text()
    paragraph = readme[readme.index("**Train long on short**"):][:600]
    assert name == "contiguous" or f"`{name}`" in paragraph, f"README's train-long-on-short paragraph omits {name}"


def test_the_docs_table_names_only_registered_schemes():
    text = (ROOT / "docs/finetune.md").read_text()
    table = text[text.index("| `train.positions` |"):]
    rows = re.findall(r"^\| `(\w+)[^`]*`", table[:table.index("\n\n")], re.M)[1:]   # past the header
    assert sorted(rows) == sorted(SHIPPED)


def test_architecture_shows_the_worked_example_as_it_is():
    """docs/ARCHITECTURE.md's scheme example is the file the contract runs (after its docstring)."""
    text = (ROOT / "docs/ARCHITECTURE.md").read_text()
    section = text[text.index("## Position schemes"):]
    section = section[:section.index("\n## ", 1)]
    block = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    code = EXAMPLE.read_text()
    assert block.strip() == code[code.index('"""', 3) + 3:].strip()


# ----------------------------------------------------------------------------- a scheme that breaks the contract
@dataclasses.dataclass(frozen=True)
class Broken(P.PositionScheme):
    """A scheme whose draw breaks the contract in the way `how` says (for the refusals below)."""

    name: ClassVar[str] = "broken"
    how: str = "reversed"

    def draw(self, n, rng):
        ids = np.arange(n) * (self.target // n)
        return {"reversed": ids[::-1].copy(), "repeated": np.sort(rng.integers(0, 3, size=n)),
                "past_target": ids + self.target - int(ids[-1]), "negative": ids - 1,
                "short": ids[:-1], "floats": ids + 0.5,
                "sometimes": ids if rng.random() < 0.5 else ids[::-1].copy()}[self.how]


BROKEN_WORDS = {
    "reversed": "drew ids[1]=", "repeated": "repeated or decreasing ids", "past_target": "outside [0, 256)",
    "negative": "ids from -1 to", "short": "ids of shape (63,) for a window of 64 tokens",
    "floats": "ids of dtype float64, not integers",
}


@pytest.mark.parametrize("how", list(BROKEN_WORDS))
def test_a_scheme_drawing_wrong_ids_is_refused_at_its_first_wrong_window(how):
    broken = Broken(target=256, how=how)
    for call in (lambda: broken.position_ids(64, seed=0, index=0),
                 lambda: broken.add_position_ids({"input_ids": token_ids(64)}, seed=0, first_index=0),
                 lambda: dataclasses.replace(broken, text="span").add_position_ids(
                     {"input_ids": token_ids(256)}, seed=0, first_index=0, window=64),
                 lambda: broken.collator()([{"input_ids": list(range(64))}])):
        with pytest.raises(InvalidParameterError) as caught:
            call()
        message = str(caught.value)
        assert BROKEN_WORDS[how] in message and "position scheme 'broken target=256" in message
        assert "strictly increasing in [0, target)" in message and "\n" not in message


@pytest.mark.parametrize("how", ["reversed", "repeated", "past_target", "sometimes"])
def test_the_recipe_refuses_a_wrong_scheme_before_anything_loads(tmp_path, tiny_dir, text_file, monkeypatch,
                                                                  capsys, how):
    """The recipe's checks draw the run's first windows: a scheme that gets them wrong is one `error:` line,
    exit code 2, before the model loads or the output folder is written."""
    from hf_posenc.recipes import finetune

    monkeypatch.setitem(P.SCHEMES, "broken", Broken)
    config = write_config(tmp_path / "c.yaml", tiny_dir, data={"corpus": str(text_file)},
                          train={"positions": f"broken how={how}"})
    assert finetune.cli(["--config", str(config)]) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("error:")]   # (datasets prints its progress)
    assert len(lines) == 1 and "Traceback" not in err
    assert lines[0].startswith(f"error: train.positions='broken how={how}': position scheme 'broken")
    assert "(test_positions.Broken) drew " in lines[0] and "(seed 3)" in lines[0]
    assert not (tmp_path / "out").exists()


def test_register_scheme_refuses_a_taken_name_naming_both_classes():
    @dataclasses.dataclass(frozen=True)
    class Pose(P.PositionScheme):
        name: ClassVar[str] = "pose"

    with pytest.raises(InvalidParameterError, match=r"'pose' is registered twice: hf_posenc.train.positions.Pose and "
                                                    r"test_positions.*Pose"):
        P.register_scheme(Pose)
    with pytest.raises(InvalidParameterError, match="takes a @dataclass"):
        P.register_scheme(dict)
    Broken.name = "Not A Name"
    try:
        with pytest.raises(InvalidParameterError, match="needs its own name, a lowercase word"):
            P.register_scheme(Broken)
    finally:
        Broken.name = "broken"
    assert P.SCHEMES["pose"] is P.Pose and "broken" not in P.SCHEMES


# ------------------------------------------------------------------------------------------ each scheme's paper
def test_pose_layout_first_id_zero_and_chunks_shifted_by_growing_skips():
    for chunks in (1, 2, 3, 5):
        for ids in draws(f"pose chunks={chunks}", 40, 500, 200):
            skip = ids - torch.arange(40)
            assert int(ids[0]) == 0
            assert bool((skip.diff() >= 0).all()) and int(skip.max()) <= 500 - 40
            assert len(set(skip.tolist())) <= chunks             # N chunks, some skips may repeat
    counts = [len(set((ids - torch.arange(40)).tolist())) for ids in draws("pose chunks=3", 40, 100000, 100)]
    assert max(counts) == 3                                       # with room, the 3 chunks show


def test_cream_layout_head_from_zero_tail_at_the_end_middle_contiguous():
    n, target = 192, 768
    scheme = P.scheme("cream", target=target)
    assert scheme.ends(n) == (round(4 * target / n), n // 3)
    kinds = []
    for ids in draws("cream", n, target, 400):
        assert int(ids[0]) == 0 and int(ids[-1]) == target - 1
        fits = [h for h in scheme.ends(n)
                if torch.equal(ids[:h], torch.arange(h)) and torch.equal(ids[-h:], torch.arange(target - h, target))
                and bool((ids[h:n - h].diff() == 1).all())]            # head, one contiguous middle, tail
        assert fits, ids
        kinds += fits if len(fits) == 1 else []
    assert 0.35 < kinds.count(16) / len(kinds) < 0.65                 # continuity half the time (default 0.5)
    # the middle lands near the middle of the target far more often than near the ends
    middles = [float(ids[n // 2]) / target for ids in draws("cream", n, target, 2000)]
    centre = sum(0.25 < m < 0.75 for m in middles) / len(middles)
    assert centre > 0.6, centre


def test_randomized_is_uniform_over_the_target():
    hits = torch.zeros(100)
    for ids in draws("randomized", 10, 100, 2000):
        hits[ids] += 1
    assert hits.min() > 0.6 * hits.mean() and hits.max() < 1.4 * hits.mean()


def test_contiguous_share_keeps_that_share_of_windows_at_0_to_n():
    plain = [bool(torch.equal(ids, torch.arange(20))) for ids in draws("pose contiguous_share=0.3", 20, 2000, 1000)]
    assert 0.25 < sum(plain) / len(plain) < 0.35


@pytest.mark.parametrize("spec, error, words", [
    ("nosuch", InvalidParameterError, "unknown position scheme 'nosuch'; known: contiguous, pose, cream"),
    ("", ParameterTypeError, "a position scheme is a name"),
    ("pose chunk=2", InvalidParameterError, "has no parameter(s) ['chunk']"),
    ("pose chunks=0", InvalidParameterError, "chunks must be >= 1"),
    ("pose chunks=2.5", ParameterTypeError, "chunks must be an int"),
    ("pose target=1", InvalidParameterError, "target must be >= 2"),
    ("pose target=nan", ParameterTypeError, "target must be an int"),
    ("cream sigma=0", InvalidParameterError, "sigma must be > 0"),
    ("cream continuity=1.5", InvalidParameterError, "continuity must be <= 1"),
    ("randomized contiguous_share=-0.1", InvalidParameterError, "contiguous_share must be >= 0"),
    ("pose contiguous_share=true", ParameterTypeError, "contiguous_share must be a number"),
    ("pose text=spans", InvalidParameterError, "text is 'window' (the window's own tokens"),
    ("contiguous text=span", InvalidParameterError, "would train the first n tokens of each span only"),
])
def test_bad_schemes_are_refused_naming_the_parameter(spec, error, words):
    with pytest.raises(error) as caught:
        P.scheme(spec)
    assert words in str(caught.value)


def test_a_window_longer_than_the_target_is_refused():
    with pytest.raises(InvalidParameterError, match="a window of 65 tokens is longer than the target context 64"):
        P.scheme("pose", target=64).position_ids(65, seed=0, index=0)
    with pytest.raises(InvalidParameterError, match="needs a target context"):
        P.scheme("cream").position_ids(8, seed=0, index=0)
    with pytest.raises(InvalidParameterError, match="cannot be cut into 4 chunks"):
        P.scheme("pose chunks=4", target=64).position_ids(3, seed=0, index=0)


def test_span_windows_refuse_what_cannot_hold_their_ids():
    span = P.scheme("pose text=span", target=256)
    with pytest.raises(InvalidParameterError, match="give window="):
        span.add_position_ids({"input_ids": token_ids(256)}, seed=0, first_index=0)
    with pytest.raises(InvalidParameterError, match="give window="):
        span.collator()
    mask = torch.ones(2, 256, dtype=torch.long)
    mask[1, 200:] = 0                                  # the corpus' last span, padded
    with pytest.raises(InvalidInputError, match="spans of 256 tokens, but row 1 has 200"):
        span.add_position_ids({"input_ids": token_ids(256, batch=2), "attention_mask": mask}, seed=0,
                              first_index=0, window=64)
    with pytest.raises(InvalidInputError, match="but row 0 has 100"):
        span.add_position_ids({"input_ids": token_ids(100)}, seed=0, first_index=0, window=64)


POSE64, SPAN64 = P.scheme("pose", target=64), P.scheme("pose text=span", target=64)
ROWS = {"input_ids": torch.zeros(2, 10, dtype=torch.long)}


@pytest.mark.parametrize("call, error, words", [
    # unbatched, mismatched, not a batch: refused, not guessed at
    (lambda: P.scheme("contiguous").add_position_ids({"input_ids": torch.arange(10)}, seed=0, first_index=0),
     InvalidInputError, "input_ids must be 2-D [rows, tokens], got shape (10,): one row is input_ids[None]"),
    (lambda: P.scheme("randomized", target=64).add_position_ids({"input_ids": torch.arange(10)}, seed=0,
                                                                first_index=0), InvalidInputError, "got shape (10,)"),
    (lambda: POSE64.add_position_ids({"input_ids": torch.zeros(2, 3, 4, dtype=torch.long)}, seed=0, first_index=0),
     InvalidInputError, "got shape (2, 3, 4)"),
    (lambda: POSE64.add_position_ids({**ROWS, "attention_mask": torch.ones(2, 9)}, seed=0, first_index=0),
     InvalidInputError, "attention_mask (2, 9) beside input_ids (2, 10)"),
    (lambda: POSE64.add_position_ids({**ROWS, "attention_mask": [[1] * 10] * 2}, seed=0, first_index=0),
     InvalidInputError, "attention_mask list beside input_ids (2, 10)"),
    (lambda: POSE64.add_position_ids({"input_ids": [[1, 2, 3]]}, seed=0, first_index=0),
     InvalidInputError, "input_ids as a tensor [rows, tokens], got input_ids of type list"),
    (lambda: POSE64.add_position_ids({"tokens": torch.zeros(1, 3)}, seed=0, first_index=0),
     InvalidInputError, "got no input_ids (keys: tokens)"),
    (lambda: POSE64.add_position_ids([[1, 2, 3]], seed=0, first_index=0), InvalidInputError, "got a list"),
    (lambda: POSE64.batch_position_ids(torch.ones(10), seed=0, first_index=0), InvalidInputError,
     "attention_mask must be a 2-D tensor [rows, tokens], got shape (10,)"),
    # numbers of the wrong kind
    (lambda: POSE64.position_ids(2.5, seed=0, index=0), ParameterTypeError,
     "n (the tokens of the window) must be an int, got 2.5"),
    (lambda: POSE64.position_ids(0, seed=0, index=0), InvalidParameterError,
     "n (the tokens of the window) must be >= 1"),
    (lambda: POSE64.position_ids(8, seed=0.5, index=0), ParameterTypeError, "seed must be an int"),
    (lambda: POSE64.add_position_ids(ROWS, seed=0, first_index=0, window=10.5), ParameterTypeError,
     "window must be an int, got 10.5"),
    (lambda: POSE64.add_position_ids(ROWS, seed=0, first_index=1.5), ParameterTypeError, "first_index must be an int"),
    (lambda: POSE64.add_position_ids(ROWS, seed=0, first_index=-1), InvalidParameterError, "first_index must be >= 0"),
    (lambda: SPAN64.add_position_ids(ROWS, seed=0, first_index=0, window=True), ParameterTypeError,
     "window must be an int, got True"),
    (lambda: P.scheme("pose", target=2.5), ParameterTypeError, "target must be an int, got 2.5"),
    (lambda: P.scheme(P.scheme("pose"), chunkz=3), InvalidParameterError,
     "position scheme 'pose' has no parameter(s) ['chunkz']; its parameters: target, contiguous_share, text, chunks"),
    (lambda: P.scheme(P.scheme("pose"), chunks=0), InvalidParameterError, "chunks must be >= 1"),
    # a window: the rows' length, honoured by the collator as by add_position_ids
    (lambda: POSE64.add_position_ids(ROWS, seed=0, first_index=0, window=8), InvalidInputError,
     "row 0 has 10 tokens, more than window=8"),
    (lambda: POSE64.collator(window=8)([{"input_ids": list(range(10))}]), InvalidInputError,
     "row 0 has 10 tokens, more than window=8"),
    (lambda: POSE64.collator(window=65), InvalidParameterError, "a window of 65 tokens is longer than the target"),
    # text=span: a row is exactly one span
    (lambda: SPAN64.add_position_ids({"input_ids": torch.zeros(2, 128, dtype=torch.long)}, seed=0, first_index=0,
                                     window=8), InvalidInputError,
     "takes each window from one span of 64 tokens, but the rows hold 128"),
    (lambda: SPAN64.collator(window=8)([{"input_ids": list(range(128))}]), InvalidInputError, "the rows hold 128"),
    # the collator's rows
    (lambda: POSE64.collator()([{"input_ids": [1, 2, 3]}, {"input_ids": [1, 2]}]), InvalidInputError,
     "row 0 has 3 tokens and row 1 2, and the collator has no base collator to pad them"),
    (lambda: POSE64.collator()([{"input_ids": [1, 2]}, {"labels": [1, 2]}]), InvalidInputError,
     "row 1 has no input_ids (its keys: labels)"),
    (lambda: POSE64.collator()([[1, 2, 3], [4, 5, 6]]), InvalidInputError,
     "row 0 is a list: the collator's rows are dicts"),
    (lambda: POSE64.collator()([{"input_ids": "to be"}]), InvalidInputError,
     "row 0's input_ids must be one list of token ids"),
    (lambda: POSE64.collator()([{"input_ids": [[1, 2], [3, 4]]}]), InvalidInputError, "one list of token ids"),
    (lambda: POSE64.collator()([]), InvalidInputError, "got an empty batch"),
    (lambda: POSE64.collator()({"input_ids": [1, 2]}), InvalidInputError, "got a dict"),
    (lambda: POSE64.collator(lambda rows: {"ids": 1})([{"input_ids": [1]}]), InvalidInputError, "got no input_ids"),
    (lambda: POSE64.collator(base="tok"), ParameterTypeError, "base must be a collator"),
    (lambda: P.PositionIdsCollator("pose"), ParameterTypeError, "scheme must be a PositionScheme"),
])
def test_the_batch_helpers_refuse_what_they_cannot_use_in_one_line(call, error, words):
    with pytest.raises(error) as caught:
        call()
    assert words in str(caught.value) and "\n" not in str(caught.value)


def test_the_collator_honours_window_as_add_position_ids_does():
    """text=window with window=: a row shorter than the window keeps 0..n-1 (the collator used to draw for it)."""
    rows = [{"input_ids": list(range(8))}, {"input_ids": list(range(10, 18))}]
    drawn = POSE64.collator(window=8, seed=2)(rows)["position_ids"]
    assert not any(torch.equal(r, torch.arange(8)) for r in drawn)              # full windows: drawn
    short = POSE64.collator(window=12, seed=2)(rows)["position_ids"]
    assert all(torch.equal(r, torch.arange(8)) for r in short)                  # short windows: 0..n-1
    same = POSE64.add_position_ids({"input_ids": torch.tensor([r["input_ids"] for r in rows])}, seed=2,
                                   first_index=0, window=12)["position_ids"]
    assert torch.equal(same, short)


def test_an_empty_batch_tensor_gives_empty_ids():
    """Zero rows is not an error for the tensor helpers (nothing to number): ids of the same empty shape."""
    out = POSE64.add_position_ids({"input_ids": torch.zeros(0, 10, dtype=torch.long)}, seed=0, first_index=0)
    assert out["position_ids"].shape == (0, 10)
    out = SPAN64.add_position_ids({"input_ids": torch.zeros(0, 64, dtype=torch.long)}, seed=0, first_index=0, window=8)
    assert out["position_ids"].shape == out["input_ids"].shape == (0, 8)


# --------------------------------------------------------------------------------- with a transformers model
def test_transformers_needs_the_mask_beside_skipped_ids_and_the_helpers_always_give_it():
    """Without an attention mask, transformers reads each jump in the ids as a new packed sequence and masks
    across it: the same ids score differently. add_position_ids and the collator always add the mask."""
    model = hp.patch(tiny_model(max_position_embeddings=64), "yarn", max_position_embeddings=256)
    ids = token_ids(32)
    pose = P.scheme("pose", target=256)
    batch = pose.add_position_ids({"input_ids": ids}, seed=0, first_index=3)
    assert torch.equal(batch["attention_mask"], torch.ones_like(ids))
    assert torch.equal(batch["position_ids"][0], pose.position_ids(32, seed=0, index=3))
    assert int(batch["position_ids"].max()) >= 32                      # this draw skips
    with torch.no_grad():
        masked = model(**batch, use_cache=False).logits                 # use_cache=False: as in training
        unmasked = model(input_ids=ids, position_ids=batch["position_ids"], use_cache=False).logits
    assert (masked - unmasked).abs().max() > 1e-3
    collated = pose.collator()([{"input_ids": ids[0].tolist()}])
    assert torch.equal(collated["attention_mask"], torch.ones_like(ids))


def test_contiguous_ids_given_explicitly_are_bit_identical_to_none():
    model = hp.patch(tiny_model(max_position_embeddings=64), "yarn", max_position_embeddings=256)
    ids = token_ids(48, batch=2)
    mask = torch.ones_like(ids)
    with torch.no_grad():
        a = model(input_ids=ids, attention_mask=mask).logits
        b = model(input_ids=ids, attention_mask=mask, position_ids=torch.arange(48).expand(2, -1)).logits
    assert torch.equal(a, b)


def test_batch_ids_follow_the_real_tokens_and_short_windows_stay_contiguous():
    pose = P.scheme("pose", target=1000)
    mask = torch.tensor([[1] * 10, [1] * 6 + [0] * 4, [0] * 3 + [1] * 7])
    ids = pose.batch_position_ids(mask, seed=5, first_index=20, window=10)
    assert torch.equal(ids[0], pose.position_ids(10, seed=5, index=20))
    assert torch.equal(ids[1], torch.tensor([0, 1, 2, 3, 4, 5, 0, 0, 0, 0]))    # short: 0..n-1, padding 0
    assert torch.equal(ids[2], torch.tensor([0, 0, 0, 0, 1, 2, 3, 4, 5, 6]))    # left padding
    spread = pose.batch_position_ids(mask, seed=5, first_index=20)              # no window: every row drawn
    assert torch.equal(spread[2, 3:], pose.position_ids(7, seed=5, index=22))


def test_collator_wraps_a_transformers_collator_and_keys_each_window_by_its_tokens():
    from transformers import DataCollatorForLanguageModeling

    from tiny import tiny_tokenizer

    tok = tiny_tokenizer()
    tok.pad_token = tok.eos_token
    collator = P.scheme("cream", target=4096).collator(DataCollatorForLanguageModeling(tok, mlm=False), seed=1)
    rows = [{"input_ids": tok("To be, or not to be, that is the question")["input_ids"]},
            {"input_ids": tok("Whether 'tis nobler in the mind to suffer")["input_ids"]}]
    batch = collator(rows)
    assert set(batch) >= {"input_ids", "attention_mask", "labels", "position_ids"}
    assert int(batch["position_ids"][0, -1]) == 4095 or not batch["attention_mask"][0, -1]
    again = collator(rows[::-1])                       # another batch, another order, same windows: same ids
    assert torch.equal(again["position_ids"][1], batch["position_ids"][0])
    with pytest.raises(InvalidParameterError, match="needs a target"):
        P.scheme("pose").collator()


# ------------------------------------------------------------------------------------------- the recipe
POSE = {"positions": "pose chunks=2"}


def test_pose_without_room_to_skip_trains_bit_identically_to_contiguous(tmp_path, tiny_dir, text_file):
    data = {"corpus": str(text_file)}
    plain = run_recipe(write_config(tmp_path / "a" / "c.yaml", tiny_dir, data=data))
    no_room = run_recipe(write_config(tmp_path / "b" / "c.yaml", tiny_dir, data=data,
                                      train={"positions": "pose chunks=3 target=64"}))
    a, b = state(plain), state(no_room)
    assert all(torch.equal(a[k], b[k]) for k in a)
    log_a, log_b = ckpt.read_log(tmp_path / "a" / "out"), ckpt.read_log(tmp_path / "b" / "out")
    assert [r["loss"] for r in log_a] == [r["loss"] for r in log_b]
    skipped = run_recipe(write_config(tmp_path / "c" / "c.yaml", tiny_dir, data=data, train=POSE))
    assert not torch.equal(state(skipped)["model.layers.0.self_attn.q_proj.weight"],
                           a["model.layers.0.self_attn.q_proj.weight"])
    card = (tmp_path / "c" / "out" / "README.md").read_text()
    pose = P.scheme("pose target=256")
    drawn = max(int(pose.position_ids(64, seed=3, index=w).max() - pose.position_ids(64, seed=3, index=w).min())
                for w in range(6 * 2 * 2))                 # steps x grad_accum x batch_size windows, one process
    assert "`pose target=256`" in card and f"its 24 windows put distances up to {drawn} in front of attention" in card
    assert 200 < drawn < 255                                 # the run's own, not the target's 255
    # the folder is a plain yarn checkpoint: stock transformers loads it with the same logits
    stock = tiny_model_from(tmp_path / "c" / "out")
    assert stock.config.rope_parameters["rope_type"] == "yarn"
    ids = token_ids(200, vocab=256)
    with torch.no_grad():
        torch.testing.assert_close(stock(ids).logits, skipped.eval()(ids).logits, rtol=0, atol=1e-5)


def test_the_recipe_loss_is_a_forward_with_the_schemes_ids(tmp_path, tiny_dir, text_file):
    """Each micro-batch's loss equals a manual forward of the initial patched model with the ids the scheme
    draws for window number ((step-1) * grad_accum + micro) * batch_size + row (lr 0: the weights stay)."""
    calls = []
    forward = TrainingLoss.forward

    def spy(self, input_ids, attention_mask, teacher=None, position_ids=None):
        loss = forward(self, input_ids, attention_mask, teacher=teacher, position_ids=position_ids)
        calls.append((input_ids.clone(), attention_mask.clone(), position_ids.clone(), loss.detach().clone()))
        return loss

    config = write_config(tmp_path / "c.yaml", tiny_dir, data={"corpus": str(text_file)},
                          train={**POSE, "steps": 2, "warmup_steps": 0, "scheduler": "constant", "lr": 1e-30,
                                 "max_grad_norm": None})
    with mock.patch.object(TrainingLoss, "forward", spy):
        run_recipe(config)
    model = hp.patch(tiny_model_from(tiny_dir), "yarn", max_position_embeddings=256)
    pose = P.scheme("pose chunks=2", target=256)
    assert len(calls) == 4
    for number, (ids, mask, positions, loss) in enumerate(calls):
        assert torch.equal(positions, pose.batch_position_ids(mask, seed=3, first_index=number * 2, window=64))
        assert int(positions.max()) > 63
        with torch.no_grad():
            logits = model(input_ids=ids, attention_mask=mask, position_ids=positions).logits
        manual = F.cross_entropy(logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten())
        torch.testing.assert_close(loss, manual, rtol=1e-5, atol=1e-6)


def test_span_training_takes_each_window_from_a_whole_span_of_the_corpus(tmp_path, tiny_dir, text_file):
    """text=span: the DataLoader gives whole 256-token spans of the packed corpus (the 1536 tokens make 6), each
    micro-batch is cut to 64-token windows at the drawn ids, and the loss is a forward of those tokens at those
    ids; a resumed run is bit-identical."""
    calls, spans = [], []
    forward, take = TrainingLoss.forward, P.PositionScheme.take_windows

    def spy(self, input_ids, attention_mask, teacher=None, position_ids=None):
        loss = forward(self, input_ids, attention_mask, teacher=teacher, position_ids=position_ids)
        calls.append((input_ids.clone(), attention_mask.clone(), position_ids.clone(), loss.detach().clone()))
        return loss

    def spy_take(self, batch, **kwargs):
        spans.append(batch["input_ids"].clone())
        return take(self, batch, **kwargs)

    span = {"positions": "pose chunks=2 text=span"}
    config = write_config(tmp_path / "c.yaml", tiny_dir, data={"corpus": str(text_file)},
                          train={**span, "steps": 2, "warmup_steps": 0, "scheduler": "constant", "lr": 1e-30,
                                 "max_grad_norm": None})
    with mock.patch.object(TrainingLoss, "forward", spy), mock.patch.object(P.PositionScheme, "take_windows",
                                                                            spy_take):
        run_recipe(config)
    model = hp.patch(tiny_model_from(tiny_dir), "yarn", max_position_embeddings=256)
    pose = P.scheme("pose chunks=2", target=256)
    assert len(calls) == len(spans) == 4
    card = (tmp_path / "out" / "README.md").read_text()
    assert "`pose target=256 text=span`" in card and "taken at its ids from a span of 256 tokens" in card
    for number, ((ids, mask, positions, loss), whole) in enumerate(zip(calls, spans)):
        assert whole.shape == (2, 256) and ids.shape == (2, 64) and bool(mask.all())
        for row in range(2):
            drawn = pose.position_ids(64, seed=3, index=number * 2 + row)
            assert torch.equal(positions[row], drawn) and torch.equal(ids[row], whole[row, drawn])
        with torch.no_grad():
            logits = model(input_ids=ids, attention_mask=mask, position_ids=positions).logits
        manual = F.cross_entropy(logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten())
        torch.testing.assert_close(loss, manual, rtol=1e-5, atol=1e-6)
    # resumed: the same spans, the same ids, the same weights
    sections = dict(data={"corpus": str(text_file)}, train={**span, "steps": 4, "save_every": 2})
    full = run_recipe(write_config(tmp_path / "full" / "c.yaml", tiny_dir, **sections))
    cut = write_config(tmp_path / "cut" / "c.yaml", tiny_dir, **sections)
    assert run_recipe(cut, "--train.stop_after_steps", "3") is None
    a, b = state(full), state(run_recipe(cut, "--resume"))
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_span_training_refuses_a_corpus_shorter_than_one_span(tmp_path, tiny_dir, text_file):
    config = write_config(tmp_path / "c.yaml", tiny_dir, data={"corpus": str(text_file / "a.txt")},
                          posenc={"method": "yarn", "max_position_embeddings": 1024},
                          train={"positions": "pose text=span"})
    with pytest.raises(ConfigError, match="has 640 tokens, fewer than one span of 1024"):
        run_recipe(config)
    assert not (tmp_path / "out").exists()


def tiny_model_from(folder):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(folder, attn_implementation="sdpa").eval()


def test_a_resumed_pose_run_draws_the_same_ids_and_ends_bit_identical(tmp_path, tiny_dir, text_file):
    sections = dict(data={"corpus": str(text_file)}, train={**POSE, "steps": 6, "save_every": 2})
    full = run_recipe(write_config(tmp_path / "full" / "c.yaml", tiny_dir, **sections))
    cut = write_config(tmp_path / "cut" / "c.yaml", tiny_dir, **sections)
    assert run_recipe(cut, "--train.stop_after_steps", "3") is None
    resumed = run_recipe(cut, "--resume")
    a, b = state(full), state(resumed)
    assert all(torch.equal(a[k], b[k]) for k in a), [k for k in a if not torch.equal(a[k], b[k])]
    assert ([r["loss"] for r in ckpt.read_log(tmp_path / "full" / "out")]
            == [r["loss"] for r in ckpt.read_log(tmp_path / "cut" / "out")])


def test_each_process_draws_the_ids_of_its_own_windows():
    from hf_posenc.recipes.finetune_recipe import window_positions

    preflight = SimpleNamespace(positions=P.scheme("randomized", target=10000), seq_len=8,
                                long_training=LongTraining())
    cfg = SimpleNamespace(train=SimpleNamespace(grad_accum=3, batch_size=2, seed=0))
    batch = {"input_ids": torch.zeros(2, 8, dtype=torch.long), "attention_mask": torch.ones(2, 8, dtype=torch.long)}
    seen = {}
    for rank in range(2):
        acc = SimpleNamespace(num_processes=2, process_index=rank)
        for step in (1, 2):
            for micro in range(3):
                for row, ids in enumerate(window_positions(preflight, batch, cfg, acc, step, micro)):
                    seen.setdefault(tuple(ids.tolist()), []).append((rank, step, micro, row))
    assert len(seen) == 2 * 2 * 3 * 2        # 24 windows, 24 different draws
    plain = SimpleNamespace(positions=P.scheme("contiguous"), seq_len=8, long_training=LongTraining())
    assert window_positions(plain, batch, cfg, acc, 1, 0) is None


@pytest.mark.parametrize("sections, words", [
    (dict(train=POSE, posenc={"method": "dynamic", "max_position_embeddings": 256}),
     "cannot train posenc method 'dynamic': its rotation is set by the largest position id"),
    (dict(train=POSE, posenc={"method": "dynamic_yarn", "max_position_embeddings": 256}),
     "cannot train posenc method 'dynamic_yarn'"),
    (dict(train=POSE, posenc={"method": "dca", "max_position_embeddings": 256}),
     "cannot train posenc method 'dca': it computes the distances inside attention from the order"),
    (dict(train=POSE, posenc={"method": "alibi", "max_position_embeddings": 256}),
     "cannot train posenc method 'alibi'"),
    (dict(train=POSE, posenc={"method": "xpos", "max_position_embeddings": 256}),
     "cannot train posenc method 'xpos': its decay counts distance by the order of the tokens"),
    (dict(train={"positions": "pose target=512"}), "target=512 is past the model's context (256 positions)"),
    (dict(train={"positions": "cream target=32"}), "a window of 64 tokens is longer than the target context 32"),
    (dict(train={"positions": "pose chunks=x"}), "train.positions='pose chunks=x': chunks must be an int"),
    (dict(train={"positions": "skipwise"}), "unknown position scheme 'skipwise'"),
    (dict(train={**POSE, "objective": "distill"}, data={"seq_len": 64}), "needs train.objective=lm"),
    (dict(train={"positions": "pose text=span"}, data={"short_share": 0.3, "short_len": 32}),
     "use the scheme's contiguous_share= to keep windows at 0..n-1, and data.short_share 0"),
])
def test_schemes_are_refused_where_they_cannot_be_right(tmp_path, tiny_dir, text_file, sections, words):
    sections = {**sections, "data": {"corpus": str(text_file), **sections.get("data", {})}}
    config = write_config(tmp_path / "c.yaml", tiny_dir, **sections)
    with pytest.raises(ConfigError) as caught:
        checks.check_config(FC.parse_config(["--config", str(config)]))
    assert words in str(caught.value)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("posenc", [None, {"method": "interpolate", "max_position_embeddings": 256}])
def test_learned_tables_are_refused_with_the_reason(tmp_path, gpt2_dir, text_file, posenc):
    config = write_config(tmp_path / "c.yaml", gpt2_dir, posenc=posenc, data={"corpus": str(text_file)},
                          train={"positions": "pose target=128"})
    with pytest.raises(ConfigError, match="one trained row per (absolute )?position"):
        checks.check_config(FC.parse_config(["--config", str(config)]))


def test_an_unpatched_rope_model_trains_with_a_target_inside_its_context(tmp_path, tiny_dir, text_file):
    config = write_config(tmp_path / "c.yaml", tiny_dir, posenc=None, data={"corpus": str(text_file)},
                          train={"positions": "pose"})
    preflight = checks.check_config(FC.parse_config(["--config", str(config)]))
    assert preflight.positions == P.scheme("pose", target=128)


@pytest.mark.parametrize("native, expected", [(True, "bf16"), (False, "no")])
def test_auto_dtype_takes_bf16_autocast_only_where_the_hardware_runs_it(monkeypatch, native, expected):
    from hf_posenc import _compat
    from hf_posenc.train.hardware import mixed_precision

    monkeypatch.setattr(_compat, "native_bfloat16", lambda device=None: (native, "probe"))
    assert mixed_precision("auto") == expected
    assert mixed_precision("float32") == "no"


def test_the_chunked_loss_takes_the_same_ids_as_the_full_one():
    from hf_posenc.train.losses import chunked_lm_loss, lm_loss

    model = hp.patch(tiny_model(max_position_embeddings=64), "yarn", max_position_embeddings=256)
    ids = token_ids(48, batch=2)
    mask = torch.ones_like(ids)
    mask[1, 40:] = 0
    positions = P.scheme("cream", target=256).batch_position_ids(mask, seed=0, first_index=0)
    full = lm_loss(model, ids, mask, positions)
    torch.testing.assert_close(chunked_lm_loss(model, ids, mask, 16, positions), full, rtol=1e-5, atol=1e-6)
    assert (full - lm_loss(model, ids, mask)).abs() > 1e-6          # the ids matter (a little, at random init)


def test_pose_trains_with_lora_trainable_norms_and_short_windows(tmp_path, tiny_dir, text_file):
    pytest.importorskip("peft")
    config = write_config(tmp_path / "c.yaml", tiny_dir, data={"corpus": str(text_file), "short_share": 0.3,
                                                               "short_len": 32},
                          train={**POSE, "steps": 3, "trainable": ["embeddings", "norms"],
                                 "lora": {"r": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]}})
    calls = []
    forward = TrainingLoss.forward

    def spy(self, input_ids, attention_mask, teacher=None, position_ids=None):
        calls.append((attention_mask.sum(1).tolist(), position_ids.clone()))
        return forward(self, input_ids, attention_mask, teacher=teacher, position_ids=position_ids)

    with mock.patch.object(TrainingLoss, "forward", spy):
        final = run_recipe(config)
    assert hp.describe(final)["method"] == "yarn"
    rows = [(n, ids[:n]) for lengths, batch_ids in calls for n, ids in zip(lengths, batch_ids)]
    assert any(n == 32 and torch.equal(ids, torch.arange(32)) for n, ids in rows)    # short windows: 0..n-1
    assert any(n == 64 and int(ids.max()) > 63 for n, ids in rows)                     # full windows: spread
