"""Learned-table families (GPT-2, OPT, BERT and their kin) on tiny models built from config: the
patched models against the unpatched ones, long inputs, save and reload, and the errors."""

from __future__ import annotations

import pytest
import torch
import transformers
from transformers import AutoConfig

import hf_posenc as hp
from hf_posenc.errors import CheckpointMismatchError
from hf_posenc.families.learned_tables import check_length
from hf_posenc.methods.learned import LearnedPositions
from hf_posenc.methods.sinusoidal import SinusoidalPositions
from hf_posenc.plan import is_patched
from hf_posenc.registry import find_family, methods_for

from tiny import tiny_model

N = 32  # positions of every tiny table
VOCAB = 100
_BERT = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, vocab_size=VOCAB)
_ROBERTA = dict(_BERT, max_position_embeddings=N + 2, pad_token_id=1)  # max_position_embeddings counts 2 more rows
_BART = dict(d_model=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2, decoder_attention_heads=2,
             encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=N, vocab_size=VOCAB)
_GPT2 = dict(n_embd=32, n_layer=2, n_head=2, n_positions=N, vocab_size=VOCAB, bos_token_id=0, eos_token_id=0)
CAUSAL, MASKED, SEQ2SEQ = (transformers.AutoModelForCausalLM, transformers.AutoModelForMaskedLM,
                           transformers.AutoModelForSeq2SeqLM)
TINY = {
    "gpt2": (CAUSAL, _GPT2),
    "gpt_bigcode": (CAUSAL, _GPT2),
    "gpt_neo": (CAUSAL, dict(hidden_size=32, num_layers=2, num_heads=2, attention_types=[[["global", "local"], 1]],
                             window_size=8, max_position_embeddings=N, vocab_size=VOCAB)),
    "opt": (CAUSAL, dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, ffn_dim=64,
                         word_embed_proj_dim=32, max_position_embeddings=N, vocab_size=VOCAB)),
    "biogpt": (CAUSAL, dict(_BERT, max_position_embeddings=N)),
    "bart": (SEQ2SEQ, _BART),
    "mbart": (SEQ2SEQ, _BART),
    "plbart": (SEQ2SEQ, _BART),
    "bert": (MASKED, dict(_BERT, max_position_embeddings=N)),
    "electra": (MASKED, dict(_BERT, embedding_size=16, max_position_embeddings=N)),
    "ernie": (MASKED, dict(_BERT, max_position_embeddings=N)),
    "megatron-bert": (MASKED, dict(_BERT, max_position_embeddings=N)),
    "albert": (MASKED, dict(_BERT, embedding_size=16, max_position_embeddings=N)),
    "roberta": (MASKED, _ROBERTA),
    "xlm-roberta": (MASKED, _ROBERTA),
    "camembert": (MASKED, _ROBERTA),
    "data2vec-text": (MASKED, _ROBERTA),
    "roberta-prelayernorm": (MASKED, _ROBERTA),
    "xmod": (MASKED, dict(_ROBERTA, languages=["en_XX"], default_language="en_XX")),
    "distilbert": (MASKED, dict(dim=32, n_layers=2, n_heads=2, hidden_dim=64, max_position_embeddings=N,
                                vocab_size=VOCAB)),
}
FAMILIES = sorted(TINY)


def tiny(model_type: str, seed: int = 0, smooth_table: bool = True, **overrides):
    auto, kwargs = TINY[model_type]
    torch.manual_seed(seed)
    config = AutoConfig.for_model(model_type, **{**kwargs, **overrides})
    model = auto.from_config(config)
    with torch.no_grad():  # a pretrained-looking table: smooth in the position, plus noise
        for table in find_family(model).tables(model) if smooth_table else []:
            rows, dim = table.module.weight.shape
            t = torch.linspace(0, 1, rows).unsqueeze(1)
            table.module.weight.copy_(0.05 * torch.sin(6 * t + torch.randn(dim)) + 0.01 * torch.randn(rows, dim))
    return model.eval()


def inputs(model, length: int, batch: int = 1, pad: int = 0, seed: int = 0) -> dict:
    """Token ids avoiding the special ids; with `pad`, the last row left-padded and (batch >= 2) the
    first row right-padded by `pad` tokens."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, VOCAB, (batch, length), generator=g)
    mask = torch.ones_like(ids)
    pad_id = model.config.pad_token_id if model.config.pad_token_id is not None else 0
    if pad:
        ids[-1, :pad], mask[-1, :pad] = pad_id, 0
        if batch > 1:
            ids[0, -pad:], mask[0, -pad:] = pad_id, 0
    out = {"input_ids": ids, "attention_mask": mask}
    if model.config.is_encoder_decoder:
        out["decoder_input_ids"] = ids
    return out


def logits(model, batch: dict) -> torch.Tensor:
    with torch.no_grad():
        return model(**batch).logits


def tables(model):
    return [t.module for t in find_family(model).tables(model)]


# -- patched vs unpatched --------------------------------------------------------------------------

@pytest.mark.parametrize("model_type", FAMILIES)
def test_factor_one_tables_are_bit_identical(model_type):
    """interpolate / tile at factor 1 rebuild the same table: same logits bit for bit, padded rows
    included (OPT's offset 2 and mask-counted positions, RoBERTa's padding_idx + 1)."""
    model = tiny(model_type)
    batch = inputs(model, N, batch=2, pad=5)
    reference = logits(model, batch)
    for method in ("interpolate", "tile"):
        hp.patch(model, method, factor=1)
        assert all(isinstance(t, LearnedPositions) for t in tables(model))
        assert torch.equal(logits(model, batch), reference), method
        hp.unpatch(model)
    assert torch.equal(logits(model, batch), reference)


@pytest.mark.parametrize("model_type", FAMILIES)
def test_long_inputs_run_forward_backward_and_generate(model_type):
    model = tiny(model_type)
    for method, params in [("sinusoidal", {"init": "fit", "trainable": True}), ("interpolate", {}), ("tile", {})]:
        hp.patch(model, method, factor=4, **params)
        model.train()
        for length in (2 * N, 4 * N):
            batch = inputs(model, length, batch=2, pad=3)
            out = model(**batch, labels=batch["input_ids"])
            out.loss.backward()
            assert torch.isfinite(out.loss) and out.logits.shape[1] == length
        model.eval()
        position_grads = [p.grad for t in tables(model) for p in t.parameters()]
        assert position_grads and all(g is not None and g.abs().sum() > 0 for g in position_grads), method
        model.zero_grad()
        if TINY[model_type][0] is not MASKED:  # generation with a cache, past the original table
            for length in (2 * N, 4 * N - 3):
                prompt = inputs(model, length)
                prompt.pop("decoder_input_ids", None)
                generated = model.generate(**prompt, max_new_tokens=3, min_new_tokens=3, do_sample=False,
                                           pad_token_id=0, decoder_start_token_id=2)
                assert generated.shape[1] == (4 if model.config.is_encoder_decoder else length + 3)
        hp.unpatch(model)


@pytest.mark.parametrize("model_type", ["gpt2", "opt", "bart", "gpt_neo"])
def test_cached_decoding_matches_a_full_forward_past_the_table(model_type):
    """Positions read through a KV cache (the table called with a past length) are the positions of a
    full forward: the last token's logits agree. The step crosses the end of the table and buffers the
    patch built (2N), so they grow from the cache length."""
    model = tiny(model_type)
    hp.patch(model, "sinusoidal", factor=2, init="fit")
    batch = inputs(model, 2 * N + 1)
    with torch.no_grad():
        if model.config.is_encoder_decoder:
            enc = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}
            first = model(**enc, decoder_input_ids=batch["decoder_input_ids"][:, :-1], use_cache=True)
            step = model(**enc, decoder_input_ids=batch["decoder_input_ids"][:, -1:],
                         past_key_values=first.past_key_values, encoder_outputs=(first.encoder_last_hidden_state,))
        else:
            ids, mask = batch["input_ids"], batch["attention_mask"]
            first = model(input_ids=ids[:, :-1], attention_mask=mask[:, :-1], use_cache=True)
            step = model(input_ids=ids[:, -1:], attention_mask=mask, past_key_values=first.past_key_values)
        full = model(**batch).logits[:, -1]  # last: a full forward first would grow everything beforehand
    torch.testing.assert_close(step.logits[:, -1], full, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("model_type", FAMILIES)
def test_fit_starts_closer_to_the_unpatched_model_than_raw(model_type):
    model = tiny(model_type)
    batch = inputs(model, N, batch=2, pad=4)
    reference = logits(model, batch)
    distance = {}
    for init in ("raw", "fit"):
        hp.patch(model, "sinusoidal", factor=2, init=init)
        distance[init] = float((logits(model, batch) - reference).abs().mean())
        hp.unpatch(model)
    assert distance["fit"] < 0.5 * distance["raw"], distance


@pytest.mark.parametrize("model_type,offset", [("gpt2", 0), ("opt", 2), ("roberta", 2), ("bart", 2)])
def test_longer_tables_keep_the_rows_below_position_0(model_type, offset):
    """Interpolation and tiling act on the positions only: OPT's/BART's two rows and RoBERTa's padding
    rows stay, position 0 stays first, the last old position ends the interpolated table."""
    model = tiny(model_type)
    old = tables(model)[0].weight.detach().clone()
    assert old.shape[0] == N + offset
    hp.patch(model, "interpolate", factor=2)
    new = tables(model)[0].weight.detach()
    assert new.shape[0] == 2 * N + offset
    assert torch.equal(new[:offset + 1], old[:offset + 1]) and torch.equal(new[-1], old[-1])
    between = old[offset] * (1 - 31 / 63) + old[offset + 1] * (31 / 63)  # position 1 reads old 1 * 31 / 63
    torch.testing.assert_close(new[offset + 1], between)
    hp.unpatch(model)
    hp.patch(model, "tile", factor=2)
    new = tables(model)[0].weight.detach()
    assert torch.equal(new[:offset], old[:offset]) and torch.equal(new[offset + N:], old[offset:])


def test_sinusoidal_values_follow_the_init():
    """raw: the formula; scaled: the formula at the table's RMS; fit: the least-squares map."""
    from hf_posenc.methods.sinusoidal import sinusoidal_table

    model = tiny("gpt2")
    learned = model.transformer.wpe.weight.detach().clone()
    formula = sinusoidal_table(torch.arange(4 * N), 32).float()
    hp.patch(model, "sinusoidal", factor=4, init="raw")
    torch.testing.assert_close(model.transformer.wpe(torch.arange(4 * N)), formula)
    hp.unpatch(model)
    hp.patch(model, "sinusoidal", factor=4, init="scaled")
    scaled = model.transformer.wpe(torch.arange(4 * N))
    assert float(scaled[:N].pow(2).mean().sqrt()) == pytest.approx(float(learned.pow(2).mean().sqrt()), rel=1e-3)
    ratio = scaled[:, 0] / formula[:, 0]
    assert torch.allclose(ratio[formula[:, 0].abs() > 0.1], ratio[formula[:, 0].abs() > 0.1][0], rtol=1e-4)
    hp.unpatch(model)
    hp.patch(model, "sinusoidal", factor=4, init="fit")
    fitted = model.transformer.wpe(torch.arange(N))
    error = float((fitted - learned).norm() / learned.norm())
    assert hp.describe(model)["fit_relative_error"] == pytest.approx(error, rel=1e-4)
    raw_error = float((formula[:N] - learned).norm() / learned.norm())
    assert error < 0.5 and error < raw_error / 50


def test_keep_learned_keeps_the_first_rows():
    model = tiny("bert")
    learned = model.bert.embeddings.position_embeddings.weight.detach().clone()
    hp.patch(model, "sinusoidal", factor=2, init="raw", keep_learned=3)
    rows = model.bert.embeddings.position_embeddings(torch.arange(5))
    assert torch.equal(rows[:3], learned[:3])
    assert not torch.allclose(rows[3:], learned[3:5])


# -- describe --------------------------------------------------------------------------------------

def test_describe_reports_the_learned_mechanism():
    model = tiny("opt")
    info = hp.describe(model)
    assert info["mechanism"] == "learned" and info["family"] == "opt"
    assert info["position_tables"] == ["decoder.embed_positions"] and info["position_offset"] == 2
    assert info["length_limit"] == N and info["method"] is None
    hp.patch(model, "sinusoidal", max_position_embeddings=4 * N, init="fit")
    info = hp.describe(model)
    assert info["mechanism"] == "learned" and info["method"] == "sinusoidal" and info["length_limit"] is None
    assert info["factor"] == 4.0 and info["max_position_embeddings"] == 4 * N
    assert info["original_max_position_embeddings"] == N
    assert info["params"]["init"] == "fit" and info["params"]["trainable"] is False
    assert 0 <= info["fit_relative_error"] < 1
    roberta = tiny("roberta")
    assert hp.describe(roberta)["position_offset"] == 2 and hp.describe(roberta)["length_limit"] == N
    hp.patch(roberta, "tile", factor=2)
    assert roberta.config.max_position_embeddings == 2 * N + 2 and hp.describe(roberta)["length_limit"] == 2 * N


def test_distilbert_own_sinusoid_is_described_and_matches_the_paper_formula():
    model = tiny("distilbert", smooth_table=False, sinusoidal_pos_embds=True)
    assert hp.describe(model)["mechanism"] == "sinusoidal"
    assert hp.describe(tiny("distilbert"))["mechanism"] == "learned"
    batch = inputs(model, N)
    reference = logits(model, batch)
    hp.patch(model, "sinusoidal", factor=2, init="raw")  # DistilBERT's table is the sinusoidal formula
    torch.testing.assert_close(logits(model, batch), reference, rtol=0, atol=1e-6)


# -- save and reload -------------------------------------------------------------------------------

ROUND_TRIPS = [(t, "sinusoidal", {"init": "fit"}) for t in FAMILIES] + [
    ("gpt2", "sinusoidal", {"init": "raw"}), ("roberta", "sinusoidal", {"init": "scaled", "keep_learned": 2}),
    ("opt", "sinusoidal", {"init": "fit", "trainable": True}),
    ("gpt2", "interpolate", {}), ("roberta", "tile", {}), ("bart", "interpolate", {}),
]


@pytest.mark.parametrize("model_type,method,params", ROUND_TRIPS)
def test_round_trips(tmp_path, model_type, method, params):
    model = tiny(model_type)
    original = inputs(model, N, batch=2, pad=3)
    original_logits = logits(model, original)
    hp.patch(model, method, factor=2, **params)
    within = inputs(model, 2 * N, batch=2, pad=3)
    patched = logits(model, within)
    model.save_pretrained(tmp_path)

    auto = TINY[model_type][0]
    stock = auto.from_pretrained(tmp_path).eval()
    assert all(type(t) not in (SinusoidalPositions, LearnedPositions) for t in tables(stock))
    assert torch.equal(logits(stock, within), patched)  # stock transformers, same logits

    restored = hp.from_pretrained(tmp_path).eval()
    assert [type(t) for t in tables(restored)] == [type(t) for t in tables(model)]
    assert torch.equal(logits(restored, within), patched)
    if method == "sinusoidal":  # unbounded again, with the same positions past the saved table
        beyond = inputs(model, 5 * N)
        assert hp.describe(restored)["length_limit"] is None
        assert torch.equal(logits(restored, beyond), logits(model, beyond))
    hp.unpatch(restored)  # back to what stock transformers loads
    assert torch.equal(logits(restored, within), patched) and not is_patched(restored)

    hp.unpatch(model)
    assert torch.equal(logits(model, original), original_logits)
    assert model.config.max_position_embeddings == TINY[model_type][1].get("max_position_embeddings", N)
    assert not hasattr(model.config, "hf_posenc")


def test_unpatch_restores_modules_buffers_and_hooks():
    model = tiny("bert")
    embeddings = model.bert.embeddings
    table, position_ids = embeddings.position_embeddings, embeddings.position_ids
    config = model.config
    hp.patch(model, "sinusoidal", factor=2)
    logits(model, inputs(model, 5 * N))  # grows the buffers
    assert embeddings.position_ids.shape[-1] >= 5 * N and embeddings._forward_pre_hooks
    hp.unpatch(model)
    assert embeddings.position_embeddings is table and embeddings.position_ids is position_ids
    assert not embeddings._forward_pre_hooks and model.config is config


def test_reload_in_another_dtype(tmp_path):
    model = tiny("opt")
    hp.patch(model, "sinusoidal", factor=2, init="fit")
    model.save_pretrained(tmp_path)
    restored = hp.from_pretrained(tmp_path, dtype=torch.bfloat16)
    table = restored.model.decoder.embed_positions
    assert isinstance(table, SinusoidalPositions) and table.projection.weight.dtype == torch.bfloat16
    batch = inputs(model, 3 * N)
    torch.testing.assert_close(logits(restored, batch).float(), logits(model, batch), rtol=0.1, atol=0.1)


def test_edited_checkpoint_is_refused(tmp_path):
    """A sinusoidal checkpoint whose table was changed since (trained as a learned table by stock
    transformers) is not silently turned back into the formula."""
    model = tiny("gpt2")
    hp.patch(model, "sinusoidal", factor=2, init="raw")
    model.save_pretrained(tmp_path)
    stock = CAUSAL.from_pretrained(tmp_path)
    with torch.no_grad():
        stock.transformer.wpe.weight[5] += 0.1
    stock.save_pretrained(tmp_path)
    with pytest.raises(CheckpointMismatchError, match="wpe"):
        hp.from_pretrained(tmp_path)


def test_two_models_do_not_share_a_patch():
    a, b = tiny("gpt2"), tiny("gpt2")
    hp.patch(a, "interpolate", factor=2)
    assert b.config.n_positions == N and not is_patched(b) and type(b.transformer.wpe) is torch.nn.Embedding


# -- errors ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("model_type,method", [("gpt2", "interpolate"), ("opt", "tile"), ("bert", "interpolate"),
                                               ("roberta", "tile"), ("bart", "interpolate"),
                                               ("gpt_neo", "tile"), ("distilbert", "interpolate")])
def test_input_longer_than_a_patched_table_is_refused_clearly(model_type, method):
    model = tiny(model_type)
    hp.patch(model, method, factor=2)
    assert logits(model, inputs(model, 2 * N)).shape[1] == 2 * N
    with pytest.raises(hp.SequenceTooLongError) as info:
        logits(model, inputs(model, 2 * N + 3))
    message = str(info.value)
    assert f"{2 * N + 3} tokens" in message and f"{2 * N} positions" in message
    assert repr(method) in message and "'sinusoidal'" in message and "hp.unpatch" in message


def test_input_longer_than_an_unpatched_table_is_refused_clearly():
    model = tiny("gpt2")
    check_length(model, N)
    with pytest.raises(hp.SequenceTooLongError, match=rf"{N + 1} tokens.*{N} positions.*'sinusoidal'"):
        check_length(model, N + 1)
    hp.patch(model, "sinusoidal", factor=2)
    check_length(model, 100 * N)  # no limit
    llama = tiny_model("llama")
    check_length(llama, 10**6)  # other mechanisms: nothing to check


@pytest.mark.parametrize("params,error,pattern", [
    ({"init": "learned", "factor": 2}, hp.InvalidParameterError, r"init must be one of \['raw', 'scaled', 'fit'\]"),
    ({"init": 3, "factor": 2}, hp.InvalidParameterError, "init must be one of"),
    ({"trainable": True, "init": "raw", "factor": 2}, hp.InvalidParameterError, "trainable=True needs init='fit'"),
    ({"trainable": "yes", "factor": 2}, hp.ParameterTypeError, "trainable must be a bool"),
    ({"base": 1, "factor": 2}, hp.InvalidParameterError, "base must be > 1"),
    ({"fit_ridge": -1, "factor": 2}, hp.InvalidParameterError, "fit_ridge must be >= 0"),
    ({"keep_learned": N, "factor": 2}, hp.InvalidParameterError, f"keep_learned={N}.*must be < {N}"),
    ({"max_position_embeddings": 0}, hp.InvalidParameterError, "max_position_embeddings must be > 0"),
    ({"max_position_embeddings": -64}, hp.InvalidParameterError, "max_position_embeddings must be > 0"),
    ({"max_position_embeddings": 64.5}, hp.ParameterTypeError, "max_position_embeddings must be an int"),
    ({"max_position_embeddings": "64"}, hp.ParameterTypeError, "max_position_embeddings must be an int"),
    ({"max_position_embeddings": N - 1}, hp.InvalidParameterError, f"shorter than the model's original context {N}"),
    ({"factor": 0}, hp.InvalidParameterError, "factor must be > 0"),
    ({"factor": 0.5}, hp.InvalidParameterError, "factor must be >= 1"),
    ({}, hp.InvalidParameterError, "needs max_position_embeddings="),
    ({"factor": 2, "window": 3}, hp.InvalidParameterError, r"unknown parameter\(s\) \['window'\]"),
])
def test_bad_parameters_are_refused_and_leave_the_model_unchanged(params, error, pattern):
    model = tiny("gpt2")
    before = {k: v.clone() for k, v in model.state_dict().items()}
    table, config = model.transformer.wpe, model.config.to_dict()
    with pytest.raises(error, match=pattern):
        hp.patch(model, "sinusoidal", **params)
    assert model.transformer.wpe is table and model.config.to_dict() == config and not is_patched(model)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_rope_methods_are_refused_on_learned_tables_and_the_reverse():
    # the methods that apply, from the registry: every method registered for the model's positions, sorted
    learned, rope = methods_for("learned"), methods_for("rope")
    assert {"alibi", "interpolate", "rope", "sinusoidal", "tile"} <= set(learned) and "yarn" not in learned
    assert {"alibi", "base", "dca", "xpos", "yarn"} <= set(rope) and "sinusoidal" not in rope
    gpt2 = tiny("gpt2")
    with pytest.raises(hp.MethodNotApplicableError) as refused:
        hp.patch(gpt2, "yarn", factor=2)
    assert str(refused.value).endswith(f"methods that apply: {', '.join(learned)}")
    assert not is_patched(gpt2) and type(gpt2.transformer.wpe) is torch.nn.Embedding
    llama = tiny_model("llama")
    with pytest.raises(hp.MethodNotApplicableError) as refused:
        hp.patch(llama, "sinusoidal", factor=2)
    assert str(refused.value).endswith(f"methods that apply: {', '.join(rope)}")
    assert not is_patched(llama)


def test_patching_twice_is_refused():
    model = tiny("bert")
    hp.patch(model, "tile", factor=2)
    with pytest.raises(hp.AlreadyPatchedError):
        hp.patch(model, "sinusoidal", factor=2)
