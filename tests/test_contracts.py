"""The method contract suite: every registered method, on the families it applies to, passes the
same checks, from what the method declares in its own module (`contract`, hf_posenc.config.Contract):

- each refused example is refused with its words, and leaves model and config as they were, bit for bit;
- the patch changes the logits past what it keeps; unpatch, and `hp.patched` left by an exception, give the
  model back bit for bit;
- save -> `hp.from_pretrained` gives the same logits (and unpatched, the model before the patch), and the
  hf_posenc record round-trips;
- stock transformers loads the saved folder as the same model where the method claims `stock_checkpoint`,
  and refuses it loudly where it does not;
- serving exports (`hp.serving_overrides`, `hp.llama_cpp_args`) agree with the saved rope_parameters;
- cached generation equals the full forward (causal models);
- inputs inside `unchanged_within` of the original context give the unpatched model's logits.

Pairs: every method with all its examples on the reference families of each mechanism it applies to (llama
for RoPE; gpt2 and bert for learned tables), and with its first example on every other family of that
mechanism with a tiny model. The pairs whose stable hash of (model_type, method) falls outside SWEEP_PERCENT
are marked `slow` (except for the patch / unpatch check, which needs no save): `-m "not slow"` is the quick run
(~35 s on two busy cores), a default run takes every pair (~85 s). A pair depends on its own names only, so
adding a method or a family never drops or moves another pair. Every test is marked `contract`. One method:
`pytest -m contract -k <method>` (-k matches substrings: `-k yarn` takes dynamic_yarn too, `-k "[yarn-"` only
yarn)."""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
import json
import re
import warnings
from pathlib import Path

import pytest
import test_learned
import test_rope_families
import torch
from test_attention_methods import randomize_tables
from tiny import token_ids
from transformers import AutoModelForCausalLM

import hf_posenc as hp
from hf_posenc.config import Contract, LearnedMethodConfig, MethodConfig, Refused, RopeMethodConfig
from hf_posenc.methods.rope import CUSTOM_ROPE_TYPE_PREFIX
from hf_posenc.plan import is_patched
from hf_posenc.record_reader import method_class, method_config, read_record
from hf_posenc.registry import FAMILIES, METHODS, register_method

pytestmark = pytest.mark.contract

ROOT = Path(__file__).resolve().parents[1]
# every method runs all its examples on these: a RoPE decoder; a learned-table decoder and encoder
REFERENCE_FAMILIES = {"rope": ("llama",), "learned": ("gpt2", "bert")}
# the share of the non-reference (model_type, method) pairs `-m "not slow"` keeps; the rest are marked `slow`
SWEEP_PERCENT = 25


# -- the families: registered model types and their tiny models --------------------------------------

def mechanisms() -> dict[str, str]:
    """model_type -> mechanism, for every model type a registered family covers."""
    return {t: family.mechanism for family in FAMILIES.values() for t in family.model_types}


def has_tiny_model(model_type: str) -> bool:
    return model_type in test_rope_families.FAMILIES or model_type in test_learned.TINY


def build(model_type: str) -> torch.nn.Module:
    if model_type in test_rope_families.FAMILIES:
        return test_rope_families.build(model_type)
    return test_learned.tiny(model_type)


def auto_class(model_type: str):
    return test_learned.TINY[model_type][0] if model_type in test_learned.TINY else AutoModelForCausalLM


def load_kwargs(model_type: str) -> dict:
    if model_type in test_rope_families.FAMILIES:
        return {"attn_implementation": test_rope_families.attn_of(model_type)}
    return {}


# -- the cases -----------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Case:
    method: str
    model_type: str
    example: int  # index into the method's contract.examples
    tier: str  # "reference", "sweep" (kept by -m "not slow") or "slow"

    @property
    def id(self) -> str:
        return f"{self.method}-{self.model_type}-{self.example}"

    @property
    def cls(self) -> type[MethodConfig]:
        return METHODS[self.method]

    @property
    def reference(self) -> bool:
        return self.tier == "reference"


def tier(model_type: str, method: str) -> str:
    """Whether the quick run (-m "not slow") takes `method` on `model_type` ("sweep") or only a full one ("slow"):
    a stable hash of the two names, nothing else."""
    digest = hashlib.sha256(f"{model_type}/{method}".encode()).hexdigest()
    return "sweep" if int(digest[:8], 16) % 100 < SWEEP_PERCENT else "slow"


def cases(methods: dict[str, type[MethodConfig]] | None = None) -> list[Case]:
    """Every method with each example on its reference families, and with its first example on every other
    family of its mechanisms that has a tiny model."""
    methods = METHODS if methods is None else methods
    kinds = mechanisms()
    out = []
    for name, cls in sorted(methods.items()):
        contract = cls.__dict__.get("contract")
        if not isinstance(contract, Contract):
            continue  # test_every_method_declares_a_contract says what to add
        for mechanism in cls.mechanisms:
            references = REFERENCE_FAMILIES[mechanism]
            out += [Case(name, r, i, "reference") for r in references for i in range(len(contract.examples))]
            out += [Case(name, t, 0, tier(t, name)) for t, kind in sorted(kinds.items())
                    if kind == mechanism and t not in references and has_tiny_model(t)]
    return out


CASES = cases()


# Pairs the package gets wrong today, each expected to fail (reported as XPASS once it works): none now. A pair
# added here must name what fails and what the package should do instead.
KNOWN_FAILURES: dict[tuple[str, str], str] = {}


def params_of(cases: list[Case], slow: bool = True) -> list:
    """pytest params of `cases`: the slow tier marked `slow` (unless slow=False), known failures xfail."""
    def marks(case: Case) -> list:
        known = KNOWN_FAILURES.get((case.model_type, case.method))
        tier = [pytest.mark.slow] if case.tier == "slow" and slow else []
        return tier + ([pytest.mark.xfail(reason=known, strict=False)] if known else [])

    return [pytest.param(c, id=c.id, marks=marks(c)) for c in cases]


ALL = params_of(CASES)
CHEAP = params_of(CASES, slow=False)  # every pair in a default run: the checks that need no save
CAUSAL = params_of([c for c in CASES if auto_class(c.model_type) is AutoModelForCausalLM])
UNCHANGED = params_of([c for c in CASES if c.example == 0 and c.cls.contract.unchanged_within is not None])
REFUSED = [pytest.param(name, i, id=f"{name}-{REFERENCE_FAMILIES[cls.mechanisms[0]][0]}-refused{i}")
           for name, cls in sorted(METHODS.items()) if isinstance(cls.__dict__.get("contract"), Contract)
           for i in range(len(cls.contract.refused))]


# -- helpers -------------------------------------------------------------------------------------------

def original_context(model) -> int:
    info = hp.describe(model)
    return info["length_limit"] if info["mechanism"] == "learned" else info["max_position_embeddings"]


def example_params(case: Case, model) -> dict:
    """The example, completed for this model as an evaluation variant is (target: twice the original)."""
    example = dict(case.cls.contract.examples[case.example])
    return case.cls.variant_defaults(example, 2 * original_context(model), hp.describe(model))


def batch(model, n: int) -> dict:
    if auto_class(model.config.model_type) is AutoModelForCausalLM and model.config.model_type not in test_learned.TINY:
        return {"input_ids": token_ids(n, batch=2, vocab=120) + 3}
    return test_learned.inputs(model, n, batch=2)


@torch.no_grad()
def logits(model, inputs: dict) -> torch.Tensor:
    return model(**inputs).logits


def snapshot(model) -> dict:
    """What a bit-exact restore gives back: every tensor, the config, the module tree, logits inside the context."""
    with torch.no_grad():
        out = logits(model, batch(model, original_context(model) // 2))
    return {"state": {k: v.clone() for k, v in model.state_dict().items()},
            "config": (model.config.to_dict(), model.config._attn_implementation),
            "modules": [(n, type(m)) for n, m in model.named_modules()], "logits": out}


def assert_same(before: dict, after: dict) -> None:
    assert after["config"] == before["config"]
    assert after["modules"] == before["modules"]
    assert after["state"].keys() == before["state"].keys()
    changed = [k for k in before["state"] if not torch.equal(before["state"][k], after["state"][k])]
    assert not changed, f"tensors changed: {changed[:5]}"
    assert torch.equal(after["logits"], before["logits"])


def patch(case: Case, model) -> int:
    """hp.patch with the case's example, returning the model's original context; a family that refuses the
    method (a sweep pair: Phi-3 takes no linear scaling, ...) must leave the model as it was, and the case is
    skipped saying why."""
    original = original_context(model)
    params = example_params(case, model)
    before = snapshot(model)
    try:
        hp.patch(model, case.method, **params)
    except REFUSALS as err:
        assert_same(before, snapshot(model))
        if case.reference:
            raise
        pytest.skip(f"{case.model_type} refuses {case.method}: {err}")
    return original


# what a family that cannot take a method raises, before anything changes
REFUSALS = (hp.MethodNotApplicableError, hp.UnsupportedModelError)

_SAVED: dict[str, tuple] = {}


@pytest.fixture
def saved(case, tmp_path_factory):
    """The case's model patched (trained tables given values), its long-input logits, and its saved folder."""
    if case.id not in _SAVED:
        model = build(case.model_type)
        original = patch(case, model)
        randomize_tables(model)
        out = logits(model, batch(model, 3 * original // 2))
        folder = tmp_path_factory.mktemp(case.id)
        model.save_pretrained(folder)
        _SAVED[case.id] = (model, out, folder, original)
    return _SAVED[case.id]


@pytest.fixture(autouse=True, scope="module")
def saved_models(one_thread):
    """One thread for the tiny models (conftest.one_thread); the saved folders dropped after the module."""
    yield
    _SAVED.clear()


# -- what every method declares --------------------------------------------------------------------------

def contract_problems(cls: type[MethodConfig]) -> list[str]:
    """What is missing or malformed in `cls`'s declaration, each said as what to write."""
    file = Path(inspect.getfile(cls)).resolve()
    where = f"{cls.__qualname__} ({file.relative_to(ROOT) if file.is_relative_to(ROOT) else file})"
    contract = cls.__dict__.get("contract")
    if contract is None:
        return [
            f"method {cls.name!r} declares no contract: tests/test_contracts.py runs every registered method from "
            f"what it declares. Add to {where} (see docs/ARCHITECTURE.md, 'The contract every method declares'):\n"
            f"    contract: ClassVar[Contract] = Contract(\n"
            f"        examples=({{...}},),  # parameters hp.patch takes, e.g. {{'factor': 2}}; at least one\n"
            f"        refused=(Refused({{...}}, \"words of the error\"),),  # refused parameters; at least one\n"
            f"        unchanged_within=None,  # or the share of the original context where inputs give the unpatched model\n"
            f"        reference=None,  # or 'tests/test_<name>.py::test_...' against the paper / transformers\n"
            f"        # a RoPE method: unpatched_at_factor_1=False where its parameters change the rotation at factor 1;\n"
            f"        # a stock_checkpoint one: expected_rope_parameters=lambda theta, dim, original: {{...}}\n"
            f"    )\n"
            f"with `from ..config import Contract, Refused`"]
    problems = []
    if not isinstance(contract, Contract):
        return [f"{where}.contract must be a hf_posenc.config.Contract, got {type(contract).__name__}"]
    if not isinstance(contract.examples, tuple) or not contract.examples \
            or not all(isinstance(e, dict) for e in contract.examples):
        problems.append(f"{where}.contract.examples must be a non-empty tuple of dicts (parameters hp.patch takes), "
                        f"got {contract.examples!r}")
    if not isinstance(contract.refused, tuple) or not contract.refused \
            or not all(isinstance(r, Refused) and isinstance(r.params, dict) and isinstance(r.error, str) and r.error
                       for r in contract.refused):
        problems.append(f"{where}.contract.refused must be a non-empty tuple of Refused(params, 'words of the "
                        f"error'), got {contract.refused!r}")
    share = contract.unchanged_within
    if share is not None and (isinstance(share, bool) or not isinstance(share, (int, float)) or not 0 < share <= 1):
        problems.append(f"{where}.contract.unchanged_within must be None or a share of the original context in "
                        f"(0, 1], got {share!r}")
    tolerance = contract.unchanged_tolerance
    if isinstance(tolerance, bool) or not isinstance(tolerance, (int, float)) or not 0 <= tolerance < 1:
        problems.append(f"{where}.contract.unchanged_tolerance must be a number in [0, 1), got {tolerance!r}")
    if not isinstance(contract.unpatched_at_factor_1, bool):
        problems.append(f"{where}.contract.unpatched_at_factor_1 must be a bool, got {contract.unpatched_at_factor_1!r}")
    tolerance = contract.factor_1_tolerance
    if isinstance(tolerance, bool) or not isinstance(tolerance, (int, float)) or not 0 <= tolerance < 1:
        problems.append(f"{where}.contract.factor_1_tolerance must be a number in [0, 1), got {tolerance!r}")
    expected = contract.expected_rope_parameters
    if expected is not None and not callable(expected):
        problems.append(f"{where}.contract.expected_rope_parameters must be None or a function (theta, dim, "
                        f"original) -> dict, got {expected!r}")
    if expected is None and issubclass(cls, RopeMethodConfig) and cls.stock_checkpoint:
        problems.append(
            f"{where} says stock_checkpoint (transformers builds it from the rope_parameters it writes), so its "
            f"contract must say which, written out from the paper: tests/test_rope_families.py checks them on every "
            f"RoPE family. Add to its Contract(...), for its first example at twice the original context:\n"
            f"        expected_rope_parameters=lambda theta, dim, original: {{\"rope_type\": ..., ...}},")
    if contract.reference is not None:
        file, _, test = str(contract.reference).partition("::")
        path = ROOT / file
        if not test or not path.is_file() or not re.search(rf"^def {re.escape(test)}\(", path.read_text(), re.M):
            problems.append(f"{where}.contract.reference {contract.reference!r} names no test: give "
                            f"'tests/<file>.py::<test function>'")
    return problems


@pytest.mark.parametrize("name", sorted(METHODS))
def test_every_method_declares_a_contract(name):
    problems = contract_problems(METHODS[name])
    assert not problems, "\n".join(problems)


def test_a_method_that_declares_nothing_is_told_what_to_declare():
    @dataclasses.dataclass
    class ToyConfig(RopeMethodConfig):
        def rope_parameters(self, base, original, dim):
            return base | {"rope_theta": base["rope_theta"] * 2}

    ToyConfig.name = "toy_contract"
    register_method(ToyConfig)
    try:
        problems = contract_problems(METHODS["toy_contract"])
        assert len(problems) == 1
        message = problems[0]
        assert "method 'toy_contract' declares no contract" in message
        assert "contract: ClassVar[Contract] = Contract(" in message and "examples=(" in message
        assert "refused=(Refused(" in message and "from ..config import Contract, Refused" in message
        assert "ToyConfig (tests/test_contracts.py)" in message  # where to add it
        assert "toy_contract" not in {c.method for c in cases()}  # no pair runs it until it declares one
        # declared, it gets its pairs, and every pair of the other methods stays
        before = set(cases({k: v for k, v in METHODS.items() if k != "toy_contract"}))
        ToyConfig.contract = Contract(examples=({},), refused=(Refused({"factor": 0}, "factor must be > 0"),))
        after = set(cases())
        assert before < after and {c.method for c in after - before} == {"toy_contract"}
        assert not contract_problems(ToyConfig)
    finally:
        del METHODS["toy_contract"]


def test_a_malformed_contract_says_what_is_wrong():
    @dataclasses.dataclass
    class Bad(RopeMethodConfig):
        contract = Contract(examples=(), refused=(("factor", 0),), unchanged_within=2.0,
                            reference="tests/test_contracts.py::test_nothing_here", unpatched_at_factor_1="yes",
                            factor_1_tolerance=-1, expected_rope_parameters={"rope_type": "linear"})

    Bad.name = "bad_contract"
    problems = "\n".join(contract_problems(Bad))
    for words in ("examples must be a non-empty tuple of dicts", "refused must be a non-empty tuple of Refused",
                  "unchanged_within must be None or a share", "names no test", "unpatched_at_factor_1 must be a bool",
                  "factor_1_tolerance must be a number in [0, 1)", "expected_rope_parameters must be None or a function"):
        assert words in problems, problems

    class Stock(RopeMethodConfig):  # a stock checkpoint must say what it writes
        stock_checkpoint = True
        contract = Contract(examples=({},), refused=(Refused({"factor": 0}, "factor must be > 0"),))

    Stock.name = "stock_contract"
    assert ["expected_rope_parameters=lambda theta, dim, original:" in p for p in contract_problems(Stock)] == [True]
    Stock.contract = dataclasses.replace(Stock.contract, expected_rope_parameters=lambda theta, dim, original: {})
    assert not contract_problems(Stock)


def test_every_registered_model_type_has_a_tiny_model():
    missing = sorted(t for t in mechanisms() if not has_tiny_model(t))
    assert not missing, (f"model types without a tiny config: {missing}; add one to tests/test_rope_families.py's "
                         f"FAMILIES (RoPE) or tests/test_learned.py's TINY (learned tables)")


def test_pairs_are_chosen_by_name_not_by_position():
    """Every method meets its reference families with all examples; the sweep is a fixed function of the names."""
    for name, cls in METHODS.items():
        for mechanism in cls.mechanisms:
            for reference in REFERENCE_FAMILIES[mechanism]:
                got = {c.example for c in CASES if c.method == name and c.model_type == reference}
                assert got == set(range(len(cls.contract.examples) if cls.contract else 0)), name
    declared = {m: cls for m, cls in METHODS.items() if isinstance(cls.__dict__.get("contract"), Contract)}
    others = {(t, m) for m, cls in declared.items() for t, kind in mechanisms().items()
              if kind in cls.mechanisms and t not in REFERENCE_FAMILIES[kind] and has_tiny_model(t)}
    assert {(c.model_type, c.method) for c in CASES if not c.reference} == others
    assert all(c.tier == tier(c.model_type, c.method) for c in CASES if not c.reference)
    reversed_methods = dict(reversed(list(METHODS.items())))
    assert set(cases(reversed_methods)) == set(CASES)


# -- the checks ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("method, index", [p.values for p in REFUSED], ids=[p.id for p in REFUSED])
def test_refused_parameters_leave_model_and_config_untouched(method, index):
    cls = METHODS[method]
    refused = cls.contract.refused[index]
    model = build(REFERENCE_FAMILIES[cls.mechanisms[0]][0])
    before = snapshot(model)
    with pytest.raises(hp.PosEncError) as raised:
        hp.patch(model, method, **refused.params)
    assert refused.error in str(raised.value), str(raised.value)
    assert not is_patched(model) and read_record(model.config) is None
    assert_same(before, snapshot(model))


@pytest.mark.parametrize("case", CHEAP)
def test_patch_changes_the_model_and_unpatch_restores_it_bit_for_bit(case):
    """The patch changes the logits past
    what it promises to keep (for a learned table: up to the table's end, as far as the unpatched model runs)."""
    model = build(case.model_type)
    before = snapshot(model)
    learned = hp.describe(model)["mechanism"] == "learned"
    original = original_context(model)
    n = original if learned else 3 * original // 2
    inputs = batch(model, n)
    unpatched = logits(model, inputs)
    patch(case, model)
    assert hp.describe(model)["method"] == case.method and is_patched(model)
    out = logits(model, inputs)
    assert torch.isfinite(out).all()
    if n > (case.cls.contract.unchanged_within or 0) * original:
        assert not torch.equal(out, unpatched), "the patch left the logits as they were"
    if learned:  # and past the original table
        assert torch.isfinite(logits(model, batch(model, 3 * original // 2))).all()
    hp.unpatch(model)
    assert not is_patched(model) and read_record(model.config) is None
    assert_same(before, snapshot(model))


@pytest.mark.parametrize("case", ALL)
def test_patched_block_restores_the_model_when_it_raises(case):
    model = build(case.model_type)
    params = example_params(case, model)
    before = snapshot(model)
    with pytest.raises(RuntimeError, match="inside the block"):
        try:
            with hp.patched(model, case.method, **params):
                assert hp.describe(model)["method"] == case.method
                raise RuntimeError("inside the block")
        except REFUSALS as err:
            assert_same(before, snapshot(model))
            if case.reference:
                raise
            pytest.skip(f"{case.model_type} refuses {case.method}: {err}")
    assert not is_patched(model)
    assert_same(before, snapshot(model))


@pytest.mark.parametrize("case", ALL)
def test_from_pretrained_gives_the_same_logits_and_record(case, saved):
    model, out, folder, original = saved
    loaded = hp.from_pretrained(folder, **load_kwargs(case.model_type)).eval()
    assert torch.equal(logits(loaded, batch(loaded, out.shape[1])), out)
    assert loaded.config._attn_implementation == model.config._attn_implementation
    assert hp.describe(loaded)["method"] == case.method
    record = read_record(model.config)
    assert read_record(loaded.config) == record
    assert method_class(record) is case.cls and method_config(record) == case.cls.from_dict(record.params)
    written = model.config.to_dict()["hf_posenc"]
    on_disk = json.loads((folder / "config.json").read_text())["hf_posenc"]
    assert on_disk == json.loads(json.dumps(written)) == record.to_dict()
    # unpatched again: the model before the patch; a learned-table method saved only the table it made, so
    # that table, as a plain one (what stock transformers loads)
    short = batch(loaded, original // 2)
    table_method = issubclass(case.cls, LearnedMethodConfig)
    before = model if table_method else build(case.model_type)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        hp.unpatch(loaded)
    assert not is_patched(loaded) and read_record(loaded.config) is None
    assert torch.equal(logits(loaded, short), logits(before, short))
    if not table_method:  # every tensor of the original model, bit for bit
        expected, got = before.state_dict(), loaded.state_dict()
        assert got.keys() == expected.keys() and all(torch.equal(got[k], v) for k, v in expected.items())


@pytest.mark.parametrize("case", ALL)
def test_stock_transformers_loads_the_same_model_or_refuses_loudly(case, saved):
    model, out, folder, _ = saved
    auto = auto_class(case.model_type)
    if case.cls.stock_checkpoint:
        stock = auto.from_pretrained(folder, **load_kwargs(case.model_type)).eval()
        assert torch.equal(logits(stock, batch(stock, out.shape[1])), out)
    else:
        with pytest.raises((KeyError, RuntimeError, ValueError)) as raised:
            auto.from_pretrained(folder, **load_kwargs(case.model_type))
        # a rope_type only hf_posenc knows is what stops it: the error names it
        rope = json.loads((folder / "config.json").read_text()).get("rope_parameters") or {}
        types = {p.get("rope_type") for p in ([rope] if "rope_type" in rope else rope.values()) if isinstance(p, dict)}
        custom = sorted(t for t in types if str(t).startswith(CUSTOM_ROPE_TYPE_PREFIX))
        assert not custom or any(t in str(raised.value) for t in custom), (custom, str(raised.value))


def _flags(args: list[str]) -> dict[str, str]:
    assert len(args) % 2 == 0 and all(a.startswith("--") for a in args[::2]), args
    return dict(zip(args[::2], args[1::2]))


@pytest.mark.parametrize("case", ALL)
def test_serving_exports_agree_with_the_saved_rope_parameters(case, saved):
    model, _, folder, _ = saved
    config = json.loads((folder / "config.json").read_text())
    text = config.get("text_config", config) if "rope_parameters" not in config else config
    try:
        overrides = hp.serving_overrides(model)
    except hp.MethodNotApplicableError as err:
        assert not (case.cls.stock_checkpoint and issubclass(case.cls, RopeMethodConfig)), (
            f"a stock RoPE checkpoint is what an engine reads, yet the export is refused: {err}")
        assert "vLLM" in str(err), str(err)  # a refusal names the engine
    else:
        assert overrides["max_position_embeddings"] == text["max_position_embeddings"]
        saved_rope, exported = text["rope_parameters"], overrides["rope_parameters"]
        nested = not any(k in saved_rope for k in ("rope_type", "rope_theta"))
        for key in (saved_rope if nested else [None]):
            ours = saved_rope[key] if nested else saved_rope
            theirs = exported[key] if nested else exported
            assert {k: theirs.get(k) for k in ours} == ours
            extra = set(theirs) - set(ours)
            spelled = {"yarn": {"attention_factor"}, "longrope": {"short_mscale", "long_mscale"}}   # engines' own keys
            assert extra <= spelled.get(ours.get("rope_type"), set()), extra
    try:
        args = hp.llama_cpp_args(model)
    except hp.MethodNotApplicableError as err:
        assert "llama.cpp" in str(err), str(err)
        return
    flags, rope = _flags(args), text["rope_parameters"]
    assert int(flags["--ctx-size"]) == text["max_position_embeddings"]
    if "rope_theta" not in rope:  # one RoPE per layer type (Gemma 3): the flags are the rescaled one's
        rope = next((p for p in rope.values() if float(flags["--rope-freq-base"]) == pytest.approx(p["rope_theta"])
                     and p.get("rope_type", "default") == flags.get("--rope-scaling", "default")), None)
        assert rope is not None, (args, text["rope_parameters"])
    assert float(flags["--rope-freq-base"]) == pytest.approx(rope["rope_theta"], rel=1e-8)
    rope_type = rope.get("rope_type", "default")
    if rope_type == "default":
        assert "--rope-scaling" not in flags
    else:
        assert flags["--rope-scaling"] == rope_type
        assert float(flags["--rope-scale"]) == pytest.approx(rope["factor"], rel=1e-8)
    if rope_type == "yarn":
        assert int(flags["--yarn-orig-ctx"]) == rope["original_max_position_embeddings"]
        assert float(flags["--yarn-beta-fast"]) == pytest.approx(rope.get("beta_fast", 32.0))
        assert float(flags["--yarn-beta-slow"]) == pytest.approx(rope.get("beta_slow", 1.0))


@pytest.mark.parametrize("case", CAUSAL)
def test_cached_generation_equals_the_full_forward(case, saved):
    """Past the original context, except for a length-dependent method (its frequencies follow the input length,
    so keys cached at one length differ from a full forward at another by definition): inside it."""
    model, _, _, original = saved
    prompt = token_ids(original - (12 if case.cls.length_dependent else 4), vocab=90) + 3
    out = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=8, min_new_tokens=8,
                         do_sample=False, output_logits=True, return_dict_in_generate=True, pad_token_id=0)
    cached = torch.stack(out.logits)[:, 0]
    full = logits(model, {"input_ids": out.sequences})[0, prompt.shape[1] - 1:-1]
    torch.testing.assert_close(cached, full, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("case", UNCHANGED)
def test_short_inputs_are_the_unpatched_model(case):
    model, reference = build(case.model_type), build(case.model_type)
    original = patch(case, model)
    n = int(case.cls.contract.unchanged_within * original)
    logits(model, batch(model, 3 * original // 2))  # a long input first: the short one must not see its state
    inputs = batch(model, n)
    tolerance = case.cls.contract.unchanged_tolerance
    if tolerance:
        torch.testing.assert_close(logits(model, inputs), logits(reference, inputs), atol=tolerance, rtol=tolerance)
    else:
        assert torch.equal(logits(model, inputs), logits(reference, inputs))
