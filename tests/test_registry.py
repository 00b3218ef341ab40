"""Registration where a method is defined, and the seams a new method plugs into without an edit elsewhere:
the registry, serving's exports (decided from the saved rope_parameters), a bias that is the same in every layer,
the learned-table limit's message, the family interface, and the validators hf_posenc's own rope types give
transformers (no "Missing validation function" warning; a tampered value refused)."""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import logging
import pkgutil
import subprocess
import sys
from typing import ClassVar

import pytest
import torch
from tiny import tiny_model, token_ids

import hf_posenc as hp
import hf_posenc.methods
from hf_posenc import attention
from hf_posenc.config import RopeMethodConfig
from hf_posenc.registry import FAMILIES, METHODS, Family, RegistrationError, register_method
from hf_posenc.methods.alibi import AlibiConfig
from hf_posenc.methods.bias import AlibiBias
from hf_posenc.methods.learned import GrownTableConfig, too_long_message
from hf_posenc.methods.rope import ntk_theta

pytestmark = pytest.mark.usefixtures("one_thread")


@contextlib.contextmanager
def registered(cls):
    register_method(cls)
    try:
        yield cls
    finally:
        del METHODS[cls.name]


@dataclasses.dataclass
class FixedNtkConfig(RopeMethodConfig):
    """NTK at a fixed alpha: what `ntk` writes at factor alpha, a stock rope_parameters."""

    name: ClassVar[str] = "toy_fixed_ntk"
    stock_checkpoint: ClassVar[bool] = True
    alpha: float = 2.0

    def rope_parameters(self, base, original, dim):
        return base | {"rope_theta": ntk_theta(base["rope_theta"], self.alpha, dim)}


def test_every_method_module_is_imported_and_every_method_registered_where_it_is_defined():
    modules = {f"hf_posenc.methods.{m.name}" for m in pkgutil.iter_modules(hf_posenc.methods.__path__)}
    assert all(importlib.import_module(m) for m in modules)
    # the package's methods, and docs/ARCHITECTURE.md's worked examples, which tests/conftest.py registers
    examples = {f"examples.{m.name}" for m in pkgutil.iter_modules(importlib.import_module("examples").__path__)}
    assert {cls.__module__ for cls in METHODS.values()} <= modules | examples
    assert len(METHODS) == len(set(METHODS.values())) >= 18


def test_an_installed_hf_posenc_lists_only_its_own_methods():
    """The worked examples are registered in the test process only: a fresh interpreter lists the package's."""
    code = ("import hf_posenc as hp\n"
            "print(','.join(m['name'] for m in hp.list_methods()))\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    listed = result.stdout.strip().split(",")
    assert listed == sorted(n for n, cls in METHODS.items() if cls.__module__.startswith("hf_posenc.methods."))
    assert not {"ntk_alpha", "reflect", "linear_bias"} & set(listed)


def test_a_name_taken_by_another_method_is_refused_naming_both():
    @dataclasses.dataclass
    class Other(RopeMethodConfig):
        name: ClassVar[str] = "yarn"

    with pytest.raises(RegistrationError, match=r"method 'yarn' is registered twice: hf_posenc\.methods\.yarn\."
                                                 r"YarnConfig and .*Other"):
        register_method(Other)
    assert METHODS["yarn"].__name__ == "YarnConfig"
    assert register_method(METHODS["yarn"]) is METHODS["yarn"]  # registering the same class again is harmless


@pytest.mark.parametrize("bad, words", [
    (int, "takes a MethodConfig subclass"),
    (type("NoName", (RopeMethodConfig,), {}), "needs its own name"),
    (type("Spaced", (RopeMethodConfig,), {"name": "two words"}), "a lowercase word"),
    (type("NoMechanism", (RopeMethodConfig,), {"name": "toy_none", "mechanisms": ("bias",)}), "mechanisms must name"),
])
def test_a_class_that_cannot_be_a_method_is_refused(bad, words):
    with pytest.raises(RegistrationError, match=words):
        register_method(bad)
    assert "toy_none" not in METHODS


def test_families_implement_the_whole_interface():
    assert FAMILIES and all(isinstance(f, Family) and FAMILIES[f.name] is f for f in FAMILIES.values())
    assert next(iter(FAMILIES.values())).name == "rope"  # asked first: a learned table swapped to rotary positions is a RoPE model
    with pytest.raises(TypeError):
        Family()  # abstract: a family states matches / describe / plan / unpatched_config


def test_a_new_rope_method_is_exported_from_what_it_saves_not_from_its_name():
    """The toy method writes what `ntk` writes: llama.cpp and vLLM take it, with the same flags as ntk's."""
    with registered(FixedNtkConfig):
        model = tiny_model("llama")
        hp.patch(model, "toy_fixed_ntk", alpha=2.0, factor=2)
        args, overrides = hp.llama_cpp_args(model), hp.serving_overrides(model)
        hp.unpatch(model)
        hp.patch(model, "ntk", factor=2)
        assert args == hp.llama_cpp_args(model)
        assert overrides == hp.serving_overrides(model)


def test_a_method_that_says_why_no_engine_runs_it_is_refused_with_its_words():
    model = tiny_model("llama")
    hp.patch(model, "dynamic", factor=2)
    with pytest.raises(hp.MethodNotApplicableError, match="engines' own 'dynamic' measures from"):
        hp.llama_cpp_args(model)
    with pytest.raises(hp.MethodNotApplicableError, match="cannot be exported to vLLM"):
        hp.serving_overrides(model)


def test_llama_cpp_refuses_a_rope_type_it_has_no_scaling_for():
    model = tiny_model("llama")
    hp.patch(model, "llama3", factor=2)
    with pytest.raises(hp.MethodNotApplicableError, match="rope_type 'llama3', whose per-pair factors no flag carries"):
        hp.llama_cpp_args(model)
    assert hp.serving_overrides(model)["rope_parameters"]["rope_type"] == "llama3"


class CountingBias(AlibiBias):
    """ALiBi that counts how often its bias is built."""

    calls = 0

    def forward(self, *args):
        CountingBias.calls += 1
        return super().forward(*args)


@pytest.mark.parametrize("same", [True, False])
def test_a_bias_the_same_in_every_layer_is_built_once_a_forward(same, monkeypatch):
    @register_method
    @dataclasses.dataclass
    class Counting(AlibiConfig):
        name: ClassVar[str] = "toy_counting_bias"

        def attention_child(self, site, module):
            bias = CountingBias(site.heads)
            bias.same_in_every_layer = same  # one module per layer: shared masks only when it says so
            return attention.PositionalAttention(causal=site.causal, bias=bias, layout=site.layout)

    try:
        model = tiny_model("llama", num_hidden_layers=3)
        hp.patch(model, "toy_counting_bias")
        CountingBias.calls = 0
        with torch.no_grad():
            model(token_ids(40))
        assert CountingBias.calls == (1 if same else 3)
    finally:
        del METHODS["toy_counting_bias"]


def test_a_bias_module_must_say_what_it_is():
    with pytest.raises(TypeError, match="hf_posenc.attention.ScoreBias"):
        attention.PositionalAttention(causal=True, bias=torch.nn.Identity())


def test_the_too_long_message_names_the_registered_table_methods():
    message = too_long_message(600, 512, None)
    assert "hp.patch(model, 'sinusoidal', max_position_embeddings=...) has no length limit" in message
    grown = sorted(n for n, cls in METHODS.items() if issubclass(cls, GrownTableConfig))
    assert {"hierarchical", "interpolate", "tile"} <= set(grown)
    assert f"{' or '.join(map(repr, grown))} with max_position_embeddings >= 600" in message


def test_any_path_to_a_patch_gives_hf_posencs_rope_types_a_validator():
    """Importing the registry (which hf_posenc.api, loading and every hp.* name import) registers the rope_types
    hf_posenc writes, so transformers never warns "Missing validation function" on a patched config; a fresh
    interpreter, since this one has imported everything already."""
    code = ("import hf_posenc.loading\n"
            "from transformers.modeling_rope_utils import RotaryEmbeddingConfigMixin as M\n"
            "from hf_posenc.config import METHODS\n"
            "missing = [n for n in METHODS if not hasattr(M, f'_validate_hf_posenc_{n}_rope_parameters')]\n"
            "assert not missing, missing\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]


def test_every_table_is_one_registry_with_one_error():
    """Methods, model families, position schemes, training losses and RULER's tasks: one Registry class, one
    RegistrationError (an InvalidParameterError), each refusal naming both entries of a name taken twice."""
    from hf_posenc.errors import InvalidParameterError
    from hf_posenc.eval import ruler
    from hf_posenc.named import Registry
    from hf_posenc.train import losses, positions

    tables = [METHODS, FAMILIES, positions.SCHEMES, losses.LOSSES, ruler.TASKS]
    assert all(type(t) is Registry and t for t in tables)
    assert issubclass(RegistrationError, InvalidParameterError)
    with pytest.raises(RegistrationError, match=r"family 'rope' is registered twice: .*RopeModels \('rope'\) and "
                                                 r".*RopeModels \('rope'\)"):
        FAMILIES.register(type(FAMILIES["rope"])())
    with pytest.raises(RegistrationError, match="register_family takes a hf_posenc.family.Family instance"):
        FAMILIES.register("rope")


# ------------------------------------------------------------------------------------------- lookups
def every_table():
    from hf_posenc.eval.ruler import TASKS
    from hf_posenc.train.losses import LOSSES
    from hf_posenc.train.positions import SCHEMES

    return {"method": METHODS, "family": FAMILIES, "position scheme": SCHEMES, "training loss": LOSSES,
            "task family": TASKS}


@pytest.mark.parametrize("kind", ["method", "family", "position scheme", "training loss", "task family"])
def test_every_table_refuses_an_unknown_name_itself_listing_the_known_and_the_closest(kind):
    from hf_posenc.errors import InvalidParameterError, UnknownNameError

    table = every_table()[kind]
    first = next(iter(table))
    for lookup in (table.get, table.__getitem__):
        with pytest.raises(UnknownNameError) as refusal:
            lookup(first + "x")   # one letter too many
        message = str(refusal.value)
        assert message.startswith(f"unknown {kind} {first + 'x'!r}; known: ")
        assert message.endswith(f" (did you mean {first!r}?)")
        assert all(name in message for name in table)
        assert isinstance(refusal.value, (KeyError, InvalidParameterError))   # callers catching either keep working
    with pytest.raises(UnknownNameError, match=f"a {kind} is named by a str, got 3"):
        table.get(3)
    assert table.get("nothing such", None) is None and table.get(first) is table[first]   # dict.get with a default


def test_the_method_table_refuses_with_its_own_error_and_parse_reads_the_spec_once():
    from hf_posenc.errors import InvalidParameterError, ParameterTypeError, UnknownMethodError

    with pytest.raises(UnknownMethodError, match=r"unknown method 'yarm'; known: .* \(did you mean 'yarn'\?\)$"):
        hp.patch(tiny_model(), "yarm", factor=2.0)
    assert METHODS.parse("yarn beta_fast=16 truncate=false mode=x") == (
        "yarn", {"beta_fast": 16, "truncate": False, "mode": "x"})
    with pytest.raises(UnknownMethodError, match="unknown method 'yarm'"):
        METHODS.parse("yarm beta_fast=16")
    with pytest.raises(InvalidParameterError, match=r"method 'yarn beta_fast=1 beta_fast=2': parameter 'beta_fast' is "
                                                    r"given twice"):
        METHODS.parse("yarn beta_fast=1 beta_fast=2")
    with pytest.raises(ParameterTypeError, match="a method is a name with key=value parameters"):
        METHODS.parse("  ")


# -- transformers' "Missing validation function" on hf_posenc's own rope types -------------------------------

class _Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


@pytest.mark.parametrize("method,params", [("dynamic_yarn", {"factor": 4}), ("dynamic", {"factor": 4}),
                                           ("alibi", {})])
def test_our_rope_types_load_and_save_without_transformers_warnings(tmp_path, method, params):
    logger = logging.getLogger("transformers.modeling_rope_utils")
    records, level = _Records(), logger.level
    logger.addHandler(records)
    logger.setLevel(logging.WARNING)
    try:
        model = hp.patch(tiny_model(), method, **params)
        model.save_pretrained(tmp_path)
        loaded = hp.from_pretrained(tmp_path)
    finally:
        logger.removeHandler(records)
        logger.setLevel(level)
    assert hp.describe(loaded)["method"] == method
    assert not [m for m in records.messages if "Missing validation function" in m], records.messages


def test_a_tampered_custom_rope_type_is_refused_by_the_validator():
    config = hp.patch(tiny_model(), "dynamic_yarn", factor=4).config
    params = dict(config.rope_parameters, factor="four")
    with pytest.raises(ValueError, match="factor must be a number >= 1, got 'four'"):
        config._validate_hf_posenc_dynamic_yarn_rope_parameters(params)
