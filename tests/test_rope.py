"""The RoPE methods on a tiny Llama: the papers' formulas, the rotary property, identity, generation,
isolation and bad input. Parity with transformers and round trips across families live in
test_rope_families.py."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import AutoModelForCausalLM, GenerationConfig
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

import hf_posenc as hp
from hf_posenc.config import RopeMethodConfig
from hf_posenc.methods import rope
from hf_posenc.registry import METHODS
from tiny import logits, tiny_config, tiny_model, token_ids

CTX = 64  # the tiny models' original context
# from the registry, so a new RoPE method is in these checks with nothing to edit here
ROPE = sorted(n for n, c in METHODS.items() if issubclass(c, RopeMethodConfig))
STATIC = [n for n in ROPE if not METHODS[n].length_dependent]  # one rotation at every length


def params_for(method, factor=2, example=0):
    """The method's contract example (hf_posenc.config.Contract), completed for the tiny Llama at `factor` times its
    context as an evaluation variant is (example=None: the method at its defaults)."""
    cls = METHODS[method]
    params = {} if example is None else dict(cls.contract.examples[example])
    return cls.variant_defaults(params, factor * CTX, {"max_position_embeddings": CTX, "rotary_dim": 16})


def test_inv_freq_is_the_paper_formula():
    for theta, dim in [(10000.0, 64), (100000.0, 64), (500000.0, 128), (10000.0, 16)]:
        expected = torch.tensor([theta ** (-2 * i / dim) for i in range(dim // 2)], dtype=torch.float64)
        torch.testing.assert_close(rope.inv_freq(theta, dim).double(), expected, rtol=1e-6, atol=0)


def test_ntk_stretches_the_lowest_frequency_by_the_factor():
    # NTK-aware scaling keeps the highest frequency and divides the lowest one by exactly s
    theta, dim, s = 10000.0, 64, 4.0
    old, new = rope.inv_freq(theta, dim).double(), rope.inv_freq(rope.ntk_theta(theta, s, dim), dim).double()
    assert new[0] == old[0]
    assert math.isclose(old[-1] / new[-1], s, rel_tol=1e-5)


def rotary_scores(model, q, k, m, n):
    """<R_m q, R_n k> with the model's own rotary module and transformers' rotation."""
    rotary = model.model.rotary_emb
    pos = torch.tensor([[m, n]])
    cos, sin = rotary(q.new_zeros(1, 2, 16), pos)
    q_rot, _ = apply_rotary_pos_emb(q.view(1, 1, 1, 16), q.view(1, 1, 1, 16), cos[:, :1], sin[:, :1])
    _, k_rot = apply_rotary_pos_emb(k.view(1, 1, 1, 16), k.view(1, 1, 1, 16), cos[:, 1:], sin[:, 1:])
    return (q_rot * k_rot).sum().double()


@pytest.mark.parametrize("method", STATIC)
@settings(max_examples=40, deadline=None)
@given(m=st.integers(0, 4 * CTX), n=st.integers(0, 4 * CTX), shift=st.integers(0, 4 * CTX))
def test_rotary_score_depends_only_on_distance(method, m, n, shift):
    model = _patched_models()[method]
    g = torch.Generator().manual_seed(m * 7919 + n)
    q, k = torch.randn(16, generator=g, dtype=torch.float64), torch.randn(16, generator=g, dtype=torch.float64)
    a = rotary_scores(model, q, k, m, n)
    b = rotary_scores(model, q, k, m + shift, n + shift)
    # transformers computes the angles in float32: m * theta_i carries ~1e-7 relative error
    assert abs(a - b) <= 1e-4 * q.norm() * k.norm(), (a, b)


_CACHE = {}


def _patched_models():
    if not _CACHE:
        for method in STATIC:
            model = tiny_model().double()
            _CACHE[method] = hp.patch(model, method, **params_for(method, 4))
    return _CACHE


@pytest.mark.parametrize("method", ROPE)
def test_factor_one_is_bit_identical(method):
    """At its defaults with a target of the original context, a method is the unpatched model (bit for bit, or within
    its contract's factor_1_tolerance), or it changes the model where its contract says it is not (ntk_alpha)."""
    contract = METHODS[method].contract
    model = tiny_model()
    ids = token_ids(3 * CTX)
    before = logits(model, ids)
    hp.patch(model, method, **params_for(method, 1, example=None))
    assert hp.describe(model)["factor"] == 1.0
    after, tolerance = logits(model, ids), contract.factor_1_tolerance
    same = torch.allclose(after, before, atol=tolerance, rtol=tolerance) if tolerance else torch.equal(after, before)
    assert same == contract.unpatched_at_factor_1, (
        f"{method}'s contract says unpatched_at_factor_1={contract.unpatched_at_factor_1}, but at factor 1 the logits "
        f"{'are' if same else 'are not'} the unpatched model's")


def test_base_with_own_theta_is_bit_identical():
    model = tiny_model()
    ids = token_ids(2 * CTX)
    before = logits(model, ids)
    hp.patch(model, "base", theta=model.config.rope_parameters["rope_theta"])
    assert torch.equal(logits(model, ids), before)


# Every method changes the logits, unpatch restores them bit for bit, dynamic methods are the unpatched model
# inside the original context (after a longer call): tests/test_contracts.py.


@pytest.mark.parametrize("length", [CTX + 1, 2 * CTX, 3 * CTX + 5])
def test_dynamic_yarn_at_length_L_is_yarn_with_factor_L_over_original(length):
    model = hp.patch(tiny_model(), "dynamic_yarn", factor=4.0)
    config = tiny_config(rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": length / CTX,
                                          "original_max_position_embeddings": CTX})
    torch.manual_seed(0)
    reference = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").eval()
    ids = token_ids(length)
    assert torch.equal(logits(model, ids), logits(reference, ids))


def _stock_dynamic_reference():
    """transformers' own "dynamic" type, with max_position_embeddings left at the original context
    (the only way it measures from the original context)."""
    config = tiny_config(rope_parameters={"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 4.0})
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").eval()


def test_dynamic_measures_from_the_original_context():
    model = hp.patch(tiny_model(), "dynamic", max_position_embeddings=4 * CTX)
    assert model.config.max_position_embeddings == 4 * CTX
    reference = _stock_dynamic_reference()
    for length in (CTX // 2, CTX + 3, 2 * CTX, 3 * CTX):
        ids = token_ids(length)
        torch.testing.assert_close(logits(model, ids), logits(reference, ids), rtol=1e-5, atol=1e-5)


def _greedy(model, prompt, new_tokens):
    model.generation_config.eos_token_id = None  # never stop early, never suppress a token
    config = GenerationConfig(max_new_tokens=new_tokens, do_sample=False, pad_token_id=0)
    with torch.no_grad():
        return model.generate(prompt, generation_config=config)


@pytest.mark.parametrize("method", STATIC)
def test_cached_generation_past_the_original_context_equals_full_forwards(method):
    model = hp.patch(tiny_model().double(), method, **params_for(method, 4))
    prompt = token_ids(CTX - 8)
    out = _greedy(model, prompt, 2 * CTX)
    assert out.shape[1] == 3 * CTX - 8
    full = logits(model, out[:, :-1]).argmax(-1)
    assert torch.equal(full[:, prompt.shape[1] - 1:], out[:, prompt.shape[1]:])


def test_dynamic_cached_generation_matches_transformers_dynamic():
    """With a KV cache, dynamic scaling re-computes frequencies for each new length while cached keys
    keep the rotation they were made with. That is the method's definition and transformers' own
    "dynamic" behaviour: generation must match it token for token."""
    model = hp.patch(tiny_model().double(), "dynamic", factor=4.0)
    reference = _stock_dynamic_reference().double()
    prompt = token_ids(CTX - 8)
    assert torch.equal(_greedy(model, prompt, 2 * CTX), _greedy(reference, prompt, 2 * CTX))


def test_isolation_between_models_sharing_a_config():
    config = tiny_config()
    torch.manual_seed(0)
    before = AutoModelForCausalLM.from_config(config).eval()
    torch.manual_seed(0)
    patched = AutoModelForCausalLM.from_config(config).eval()
    ids = token_ids(2 * CTX)
    reference = logits(before, ids)
    hp.patch(patched, "yarn", factor=4.0)
    torch.manual_seed(0)
    after = AutoModelForCausalLM.from_config(config).eval()
    assert config.rope_parameters == {"rope_theta": 10000.0, "rope_type": "default"}
    assert config.max_position_embeddings == CTX and not hasattr(config, "hf_posenc")
    assert torch.equal(logits(before, ids), reference)
    assert torch.equal(logits(after, ids), reference)
    assert before.model.rotary_emb.config is before.config
    assert patched.model.rotary_emb.config is patched.config is not config
    assert hp.describe(before)["method"] is None and hp.describe(patched)["method"] == "yarn"


def test_describe():
    model = tiny_model()
    info = hp.describe(model)
    assert info | {} == info and info["mechanism"] == "rope" and info["method"] is None
    assert info["max_position_embeddings"] == CTX and info["factor"] == 1.0
    hp.patch(model, "yarn", max_position_embeddings=4 * CTX, beta_fast=16)
    info = hp.describe(model)
    assert (info["method"], info["factor"], info["max_position_embeddings"]) == ("yarn", 4.0, 4 * CTX)
    assert info["original_max_position_embeddings"] == CTX and info["params"]["beta_fast"] == 16
    assert info["model_type"] == "llama" and info["rope_theta"] == 10000.0


def test_factor_and_target_derive_each_other():
    a = hp.describe(hp.patch(tiny_model(), "linear", factor=2.5))
    b = hp.describe(hp.patch(tiny_model(), "linear", max_position_embeddings=160))
    assert a["max_position_embeddings"] == b["max_position_embeddings"] == 160
    assert a["factor"] == b["factor"] == 2.5


def test_method_config_object():
    model = hp.patch(tiny_model(), hp.configs.YarnConfig(factor=2.0, beta_fast=24))
    assert hp.describe(model)["params"]["beta_fast"] == 24


# -- bad input: a clear error naming the parameter, and the model left as it was ---------------

BAD = [
    ("nope", {"factor": 2.0}, hp.UnknownMethodError, f"unknown method 'nope'; known: {', '.join(METHODS)}"),
    ("linear", {"factor": 0}, hp.InvalidParameterError, "factor must be > 0, got 0"),
    ("linear", {"factor": -2.0}, hp.InvalidParameterError, "factor must be > 0"),
    ("linear", {"factor": float("nan")}, hp.InvalidParameterError, "factor must be finite, got nan"),
    ("linear", {"factor": float("inf")}, hp.InvalidParameterError, "factor must be finite"),
    ("linear", {"factor": True}, hp.ParameterTypeError, "factor must be a number, got True (bool)"),
    ("linear", {"factor": "2"}, hp.ParameterTypeError, "factor must be a number, got '2' (str)"),
    ("linear", {"factor": 0.5}, hp.InvalidParameterError, "factor must be >= 1"),
    ("linear", {"max_position_embeddings": 32}, hp.InvalidParameterError, "shorter than the model's original context 64"),
    ("linear", {"max_position_embeddings": 100.0}, hp.ParameterTypeError, "max_position_embeddings must be an int"),
    ("linear", {"max_position_embeddings": 0}, hp.InvalidParameterError, "max_position_embeddings must be > 0"),
    ("linear", {}, hp.InvalidParameterError, "needs max_position_embeddings="),
    ("linear", {"factor": 2.0, "max_position_embeddings": 256}, hp.InvalidParameterError,
     "factor=2.0 and max_position_embeddings=256 disagree"),
    ("linear", {"factr": 2.0}, hp.InvalidParameterError, "unknown parameter(s) ['factr'] for method 'linear'"),
    ("yarn", {"factor": 2.0, "beta_fast": 1, "beta_slow": 1}, hp.InvalidParameterError, "beta_fast must be > beta_slow"),
    ("yarn", {"factor": 2.0, "beta_fast": 1.0, "beta_slow": 4.0}, hp.InvalidParameterError, "beta_fast=1.0, beta_slow=4.0"),
    ("longrope", {"factor": 2.0, "long_factor": [2.0] * 5}, hp.InvalidParameterError,
     "long_factor has 5 values; this model's rotary dimension needs exactly 8"),
    ("longrope", {"factor": 2.0, "long_factor": [2.0] * 8, "short_factor": [1.0] * 3}, hp.InvalidParameterError,
     "short_factor has 3 values"),
    ("longrope", {"factor": 2.0}, hp.InvalidParameterError, "needs long_factor="),
    ("longrope", {"factor": 2.0, "long_factor": 2.0}, hp.ParameterTypeError, "long_factor must be a list"),
    ("base", {}, hp.InvalidParameterError, "needs theta="),
    ("base", {"theta": -1.0}, hp.InvalidParameterError, "theta must be > 0"),
    ("llama3", {"factor": 2.0, "low_freq_factor": 4.0, "high_freq_factor": 1.0}, hp.InvalidParameterError,
     "high_freq_factor must be > low_freq_factor"),
]


@pytest.mark.parametrize("method,params,error,message", BAD, ids=[f"{m}-{sorted(p)}" for m, p, _, _ in BAD])
def test_bad_input_is_refused_and_the_model_left_unchanged(method, params, error, message):
    model = tiny_model()
    ids = token_ids(CTX)
    before = logits(model, ids)
    with pytest.raises(error) as info:
        hp.patch(model, method, **params)
    assert message in str(info.value)
    assert isinstance(info.value, (ValueError, TypeError))
    assert torch.equal(logits(model, ids), before)
    assert model.config.rope_parameters == {"rope_theta": 10000.0, "rope_type": "default"}
    assert hp.describe(model)["method"] is None


def test_patching_twice_says_how_to_repatch():
    model = hp.patch(tiny_model(), "linear", factor=2.0)
    with pytest.raises(hp.AlreadyPatchedError, match=r"call hp.unpatch\(model\) first"):
        hp.patch(model, "yarn", factor=4.0)
    assert hp.describe(model)["method"] == "linear"
    hp.patch(hp.unpatch(model), "yarn", factor=4.0)
    assert hp.describe(model)["method"] == "yarn"


def test_unpatch_of_an_unpatched_model():
    with pytest.raises(hp.NotPatchedError):
        hp.unpatch(tiny_model())


def test_model_without_positions_names_its_type_and_the_supported_families():
    from transformers import MambaConfig, MambaForCausalLM

    model = MambaForCausalLM(MambaConfig(vocab_size=64, hidden_size=16, num_hidden_layers=1, state_size=4))
    with pytest.raises(hp.UnsupportedModelError, match=r"model_type 'mamba'.*Tested families: .*llama"):
        hp.patch(model, "yarn", factor=2.0)


def test_rope_method_on_a_learned_position_model_names_the_methods_that_apply():
    from transformers import GPT2Config, GPT2LMHeadModel

    model = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_embd=32, n_layer=1, n_head=2, n_positions=32))
    with pytest.raises(hp.MethodNotApplicableError, match=r"method 'yarn' applies to rope positions.*learned") as info:
        hp.patch(model, "yarn", factor=2.0)
    assert "interpolate" in str(info.value)


def test_natively_scaled_checkpoint_needs_replace_native():
    model = tiny_model(rope_parameters={"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0})
    with pytest.raises(hp.MethodNotApplicableError, match="already ships rope_type='linear'.*replace_native=True"):
        hp.patch(model, "yarn", factor=4.0)
    hp.patch(model, "yarn", factor=4.0, replace_native=True)
    assert model.config.rope_parameters["rope_type"] == "yarn"


def test_unpatch_after_the_model_was_cast():
    model = hp.patch(tiny_model(), "yarn", factor=2.0).double()
    hp.unpatch(model)
    reference = tiny_model().double()
    ids = token_ids(2 * CTX)
    assert torch.equal(logits(model, ids), logits(reference, ids))


def test_yarn_truncate_false_is_refused_where_transformers_would_ignore_it():
    model = tiny_model("gemma3_text", layer_types=["sliding_attention", "full_attention"], sliding_window=16)
    with pytest.raises(hp.MethodNotApplicableError, match="truncate=False cannot be expressed"):
        hp.patch(model, "yarn", factor=2.0, truncate=False)
    assert hp.describe(model)["method"] is None
    hp.patch(tiny_model(), "yarn", factor=2.0, truncate=False)  # a flat rope_parameters takes it


def test_per_layer_heterogeneous_configs_are_refused_clearly():
    model = tiny_model("gemma4_text")
    for call in (lambda: hp.describe(model), lambda: hp.patch(model, "yarn", factor=2.0)):
        with pytest.raises(hp.UnsupportedModelError, match="per-layer \\(heterogeneous\\) config"):
            call()
