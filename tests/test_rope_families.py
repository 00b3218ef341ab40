"""The generic RoPE adapter across the causal-LM families of transformers it is tested on:
parity with transformers' own RoPE functions and with the papers' formulas, refusals, factor-1 identity.

Everything here builds tiny models from config (no hub) and runs them on one thread. The checks every method
shares (save / reload, stock loading, unpatch) run from tests/test_contracts.py. The file takes ~10-20 s on two
cores."""

import math

import pytest
import torch
from transformers import AutoModelForCausalLM
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

import hf_posenc as hp
from hf_posenc.config import RopeMethodConfig
from hf_posenc.families.rope_models import TESTED_MODEL_TYPES
from hf_posenc.registry import METHODS
from hf_posenc.export.serving import _written_rope_type
from tiny import ROPE_FAMILIES, logits, tiny_config, token_ids

CTX = 64  # the tiny models' original context (tiny.TINY)
LONG = 3 * CTX // 2  # past the original context, inside the factor-2 target
# From the registry, with what each method declares in its contract (hf_posenc.config.Contract), so a new RoPE
# method is in every check here with nothing to edit: every RoPE method; those expressible as stock rope_parameters
ROPE = sorted(n for n, c in METHODS.items() if issubclass(c, RopeMethodConfig))
STOCK = [n for n in ROPE if METHODS[n].stock_checkpoint]

FAMILIES = ROPE_FAMILIES   # model_type -> config overrides on top of tiny.TINY (tests/tiny.py)

# The rope_types a family's own config check accepts, where it restricts them (so transformers could neither save
# nor load the others): hf_posenc refuses a method that writes another at patch time, before the model is touched.
ACCEPTED_ROPE_TYPES = {
    "phi3": {"default", "longrope"},  # Phi3Config's own check
}
# family -> the RoPE methods it refuses, from the rope_type each writes
REFUSED = {family: {m for m in ROPE if _written_rope_type(METHODS[m]) not in accepted}
           for family, accepted in ACCEPTED_ROPE_TYPES.items()}


def supported(family, methods):
    return [m for m in methods if m not in REFUSED.get(family, ())]


def build(family):
    overrides = dict(FAMILIES[family])
    attn = overrides.pop("attn_implementation", "sdpa")
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(tiny_config(family, **overrides), attn_implementation=attn).eval()


def attn_of(family):
    return FAMILIES[family].get("attn_implementation", "sdpa")


def scaled_key(config):
    """The rope_parameters key a default patch rescales: "full_attention" when nested by layer type."""
    return "full_attention" if "full_attention" in config.rope_parameters else None


def native_parameters(config, key):
    return dict(config.rope_parameters if key is None else config.rope_parameters[key])


def rotary_dim(config, native):
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return int(head_dim * native.get("partial_rotary_factor", 1.0))


def method_params(method, model, factor=2):
    """The method's first contract example, completed for `model` at `factor` times its context as an evaluation
    variant is (what tests/test_contracts.py runs; longrope's ramp of per-pair factors, ...)."""
    cls = METHODS[method]
    return cls.variant_defaults(dict(cls.contract.examples[0]), factor * CTX, hp.describe(model))


def expected_parameters(method, native, dim):
    """The rope_parameters that express `method`'s first example at factor 2 in transformers' own terms, as the
    method's contract writes them out from its paper (`expected_rope_parameters`), on the layer's own settings."""
    plain = {k: native[k] for k in ("rope_theta", "partial_rotary_factor") if k in native}
    return plain | METHODS[method].contract.expected_rope_parameters(native["rope_theta"], dim, CTX)


# what transformers' ROPE_INIT_FUNCTIONS use for optional keys a config leaves out
TRANSFORMERS_DEFAULTS = {"yarn": {"beta_fast": 32.0, "beta_slow": 1.0, "truncate": True}}


def the_rotary(model):
    found = [m for m in model.modules() if type(m).__name__.endswith("RotaryEmbedding")]
    assert len(found) == 1, found
    return found[0]


def prefix(key):
    return "" if key is None else f"{key}_"


pytestmark = pytest.mark.usefixtures("one_thread")


_BASELINES = {}


def baseline(family, ids):
    key = (family, ids.shape[-1])
    if key not in _BASELINES:
        _BASELINES[key] = logits(build(family), ids)
    return _BASELINES[key]


def test_tested_model_types_are_this_files_families():
    assert set(TESTED_MODEL_TYPES) == set(FAMILIES)


@pytest.mark.parametrize("family", FAMILIES)
def test_family_is_found_and_described(family):
    model = build(family)
    info = hp.describe(model)
    native = native_parameters(model.config, scaled_key(model.config))
    assert (info["model_type"], info["family"], info["mechanism"], info["method"]) == (family, "rope", "rope", None)
    assert info["rotary_dim"] == rotary_dim(model.config, native)
    assert info["rope_theta"] == native["rope_theta"]
    assert info["rope_layer_types"] == (list(model.config.rope_parameters) if scaled_key(model.config) else None)


@pytest.mark.parametrize(("family", "method"), [(f, m) for f in FAMILIES for m in supported(f, STOCK)])
def test_rotary_matches_transformers_and_the_paper_formula(family, method):
    model = build(family)
    key = scaled_key(model.config)
    native = native_parameters(model.config, key)
    dim = rotary_dim(model.config, native)
    before = {name: b.clone() for name, b in the_rotary(model).named_buffers()}
    untouched = {k: dict(v) for k, v in model.config.rope_parameters.items() if k != key} if key else {}

    hp.patch(model, method, **method_params(method, model))
    expected = expected_parameters(method, native, dim)
    config = model.config
    got = native_parameters(config, key)
    assert math.isclose(got["rope_theta"], expected["rope_theta"], rel_tol=1e-12)
    others = {k: v for k, v in expected.items() if k != "rope_theta"}
    assert {k: got.get(k) for k in others} == others
    # anything else written must be what transformers assumes when the key is absent
    assert {k: v for k, v in got.items() if k not in expected} == {
        k: v for k, v in TRANSFORMERS_DEFAULTS.get(expected["rope_type"], {}).items() if k in got}
    assert config.max_position_embeddings == 2 * CTX

    # transformers' own computation on a fresh config carrying the same rope_parameters
    overrides = {k: v for k, v in FAMILIES[family].items() if k != "attn_implementation"}
    rope_parameters = expected if key is None else {**untouched, key: expected}
    fresh = tiny_config(family, **overrides, max_position_embeddings=config.max_position_embeddings,
                        rope_parameters=rope_parameters)
    rotary = the_rotary(model)
    kwargs = {} if key is None else {"layer_type": key}
    if expected["rope_type"] == "default":
        ref_freq, ref_scaling = type(rotary).compute_default_rope_parameters(fresh, **kwargs)
    else:
        ref_freq, ref_scaling = ROPE_INIT_FUNCTIONS[expected["rope_type"]](fresh, None, **kwargs)
    assert torch.equal(getattr(rotary, prefix(key) + "inv_freq"), ref_freq)
    assert getattr(rotary, prefix(key) + "attention_scaling") == ref_scaling

    if expected["rope_type"] == "default":
        # RoPE's formula theta_i = base'^(-2i/d) with the new base, computed here in float64
        new_base = expected["rope_theta"]
        seed = torch.tensor([new_base ** (-2 * i / dim) for i in range(dim // 2)], dtype=torch.float64)
        torch.testing.assert_close(getattr(rotary, prefix(key) + "inv_freq").double(), seed, rtol=1e-6, atol=0)
        assert getattr(rotary, prefix(key) + "attention_scaling") == 1.0
    if method == "ntk":  # NTK-aware: the lowest frequency is divided by exactly the factor
        assert math.isclose(before[prefix(key) + "inv_freq"][-1] / getattr(rotary, prefix(key) + "inv_freq")[-1],
                            2.0, rel_tol=1e-5)

    # other layer types (Gemma 3's sliding window) keep their RoPE bit for bit
    for other, params in untouched.items():
        assert config.rope_parameters[other] == params
        assert torch.equal(getattr(rotary, f"{other}_inv_freq"), before[f"{other}_inv_freq"])
        assert getattr(rotary, f"{other}_attention_scaling") == 1.0


def test_gemma3_layer_types_selects_what_is_rescaled():
    model = build("gemma3_text")
    sliding = model.config.rope_parameters["sliding_attention"]["rope_theta"]
    full = model.config.rope_parameters["full_attention"]["rope_theta"]
    hp.patch(model, "base", factor=2.0, layer_types=["sliding_attention", "full_attention"])
    assert model.config.rope_parameters["sliding_attention"]["rope_theta"] == 2.0 * sliding
    assert model.config.rope_parameters["full_attention"]["rope_theta"] == 2.0 * full
    hp.unpatch(model)
    hp.patch(model, "linear", factor=2.0, layer_types="sliding_attention")
    assert model.config.rope_parameters["sliding_attention"]["rope_type"] == "linear"
    assert model.config.rope_parameters["full_attention"]["rope_type"] == "default"


def test_describe_reports_each_layer_types_rope():
    model = build("gemma3_text")
    params = model.config.rope_parameters
    hp.patch(model, "yarn", factor=2.0)  # by default only the full-attention layers are rescaled
    by_type = hp.describe(model)["rope_by_layer_type"]
    assert set(by_type) == {"sliding_attention", "full_attention"}
    assert by_type["sliding_attention"] == {"rope_type": "default", "factor": 1.0, "rotary_dim": 16,
                                            "rope_theta": params["sliding_attention"]["rope_theta"]}
    assert by_type["full_attention"]["rope_type"] == "yarn" and by_type["full_attention"]["factor"] == 2.0
    assert by_type["full_attention"]["rope_theta"] == params["full_attention"]["rope_theta"]
    assert hp.describe(build("llama"))["rope_by_layer_type"] is None


@pytest.mark.parametrize(("family", "method"), sorted((f, m) for f, ms in REFUSED.items() for m in ms))
def test_refused_methods_leave_the_model_untouched(family, method):
    model = build(family)
    original = model.config.to_dict()
    rotary = the_rotary(model)
    with pytest.raises(hp.MethodNotApplicableError, match=f"method '{method}' cannot be written into this {family}"):
        hp.patch(model, method, **method_params(method, model))
    assert hp.describe(model)["method"] is None
    assert model.config.to_dict() == original
    assert the_rotary(model) is rotary
    ids = token_ids(LONG)
    assert torch.equal(logits(model, ids), baseline(family, ids))


# Save / reload (hp.from_pretrained and stock transformers), length-dependent checkpoints stock transformers
# refuses, and patch / unpatch on every family: tests/test_contracts.py, for every method on every family.


# the RoPE methods whose contract says factor 1 is the unpatched model (tests/test_rope.py checks the others change it)
IDENTICAL_AT_1 = [m for m in ROPE if METHODS[m].contract.unpatched_at_factor_1]


@pytest.mark.parametrize(("family", "method"), [(f, m) for f in FAMILIES for m in supported(f, IDENTICAL_AT_1)])
def test_factor_one_is_bit_identical(family, method):
    """The method at its defaults with a target of the original context, past it (3x): the unpatched model."""
    model = build(family)
    ids = token_ids(3 * CTX)
    hp.patch(model, method, **method_params(method, model, factor=1))
    assert hp.describe(model)["factor"] == 1.0
    tolerance = METHODS[method].contract.factor_1_tolerance
    if tolerance:
        torch.testing.assert_close(logits(model, ids), baseline(family, ids), atol=tolerance, rtol=tolerance)
    else:
        assert torch.equal(logits(model, ids), baseline(family, ids))


@pytest.mark.parametrize("family", FAMILIES)
def test_the_decoder_under_the_head_rebuilds_the_models_logits(family):
    """The long losses and probes run the decoder and the output layer apart (never [n, vocab] logits of the whole
    window): every family's decoder is found, Llama 4's text LM included (its base_model is the LM itself)."""
    from hf_posenc import causal_lm

    model = build(family)
    assert causal_lm.decoder(model) is not model
    ids = token_ids(12)
    hidden = causal_lm.hidden_states(model, ids, torch.ones_like(ids))
    torch.testing.assert_close(causal_lm.output_logits(model, hidden), logits(model, ids))


@pytest.mark.parametrize("family", FAMILIES)
def test_auto_attention_is_one_the_family_runs(family, monkeypatch):
    """"auto" on a CPU: sdpa where the family's class runs it, eager where it does not (Gemma 2); a given one kept."""
    from hf_posenc.train.hardware import choose_attention

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    config = tiny_config(family, **{k: v for k, v in FAMILIES[family].items() if k != "attn_implementation"})
    chosen = choose_attention("auto", config)
    assert chosen == attn_of(family)
    AutoModelForCausalLM.from_config(config, attn_implementation=chosen)   # transformers builds it so
    assert choose_attention("eager", config) == "eager" and choose_attention("auto") == "sdpa"
