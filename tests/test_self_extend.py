"""Self-Extend: the attention computation against a reference written from the paper (explicit
position matrices, one softmax over an L x L score matrix), the longest input it supports, then through tiny
models of several RoPE families, as tests/test_dca.py does for Dual Chunk Attention."""

from __future__ import annotations

import re

import pytest
import torch
from test_dca import (CACHE_IMPLEMENTATIONS, CTX, FAMILIES, LseCalls, build, check_against_reference,
                      check_bf16_autocast, check_cached_generation, check_padded_row_alone, ids, reference_attention,
                      runnable_cache)

import hf_posenc as hp
from hf_posenc.methods import remapped
from hf_posenc.methods.self_extend import SelfExtendAttention, longest_input
from hf_posenc.plan import is_patched


def self_extend_positions(n: int, G: int, W: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The paper's positions: true ones for i - j < W, else floor(i / G) + W - floor(W / G) and floor(j / G)."""
    i, j = torch.meshgrid(torch.arange(n), torch.arange(n), indexing="ij")
    near = i - j < W
    return torch.where(near, i, i // G + W - W // G), torch.where(near, j, j // G)


@pytest.mark.parametrize("G, W", [(2, 16), (4, 16), (3, 10), (8, 40), (6, 50)])
def test_self_extend_matches_the_papers_position_matrices(G, W, monkeypatch):
    monkeypatch.setattr(remapped, "QUERY_BLOCK", 8)  # bands wider and narrower than a block
    attention = SelfExtendAttention(build().model.rotary_emb, CTX, G, W)
    check_against_reference(attention, lambda m: self_extend_positions(m, G, W))


@pytest.mark.parametrize("G, W", [(2, 16), (3, 10), (5, 16), (4, 63)])
def test_longest_input_is_the_last_length_whose_positions_stay_below_the_context(G, W):
    longest = longest_input(G, W, CTX)
    query, key = self_extend_positions(longest + 1, G, W)
    distance = (query - key)[torch.ones(longest + 1, longest + 1, dtype=torch.bool).tril()]
    inside = (query - key)[:longest, :longest][torch.ones(longest, longest, dtype=torch.bool).tril()]
    assert inside.max() == CTX - 1 and inside.min() >= 0
    assert distance.max() == CTX  # one more token and a distance reaches the context
    if W % G == 0:
        assert longest == (CTX - W) * G + W  # the paper's formula


@pytest.mark.parametrize("model_type", list(FAMILIES))
def test_inputs_within_the_window_are_the_unpatched_model(model_type):
    model, reference = build(model_type), build(model_type)
    hp.patch(model, "self_extend", group_size=4, window=32)
    batch = ids(32, batch=2)
    with torch.no_grad():
        torch.testing.assert_close(model(batch).logits, reference(batch).logits, atol=1e-5, rtol=1e-5)
        long = model(ids(160, batch=2)).logits
        unpatched = reference(ids(160, batch=2)).logits
    assert torch.isfinite(long).all() and (long[:, 32:] - unpatched[:, 32:]).abs().max() > 1e-5


@pytest.mark.parametrize("model_type", ["llama", "phi", "gpt_neox"])
def test_model_equals_the_reference(model_type, monkeypatch):
    monkeypatch.setattr(remapped, "QUERY_BLOCK", 16)
    model = build(model_type)
    hp.patch(model, "self_extend", group_size=3, window=20)
    batch = ids(90, batch=2)
    with torch.no_grad():
        ours = model(batch).logits
        attention = next(m for m in model.modules() if isinstance(m, SelfExtendAttention))

        def reference(query, key, value, scale):
            cos, sin = attention.table(max(CTX, query.shape[-2]), query)
            pq, pk = self_extend_positions(query.shape[-2], 3, 20)
            return reference_attention(query, key, value, cos, sin, pq, pk, scale).to(query.dtype)

        monkeypatch.setattr(attention, "attend", reference)
        torch.testing.assert_close(ours, model(batch).logits, atol=1e-4, rtol=1e-4)


def test_sdpa_kernel_with_block_sized_masks_only(monkeypatch):
    monkeypatch.setattr(remapped, "QUERY_BLOCK", 8)
    model = build()
    hp.patch(model, "self_extend", group_size=2, window=24)
    calls = LseCalls(monkeypatch)
    with torch.no_grad():
        model(ids(100, batch=2))
    # the window (24) is wider than two blocks' queries: blocks of 16 queries, the masks only where the band starts
    assert calls.shapes and all(q <= 16 for q, _ in calls.shapes) and any(q == 16 for q, _ in calls.shapes)
    assert all(m is None or m.numel() <= 16 * 16 for m in calls.masks)


def test_bf16_autocast_runs_the_fused_kernel_within_bf16_of_float32(monkeypatch):
    monkeypatch.setattr(remapped, "QUERY_BLOCK", 8)  # masked band ends and staircases in bfloat16 too
    model = hp.patch(build(), "self_extend", group_size=8, window=24)
    check_bf16_autocast(model, build(), monkeypatch)


def test_cached_generation_equals_the_full_forward_with_left_padding():
    check_cached_generation(hp.patch(build(), "self_extend", group_size=3, window=12), row=0, pad=5)


@pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::DeprecationWarning", "ignore::UserWarning")
@pytest.mark.parametrize("pad", [0, 5])
@pytest.mark.parametrize("implementation", CACHE_IMPLEMENTATIONS)
def test_cached_generation_equals_the_full_forward_with_every_cache(implementation, pad):
    model = hp.patch(build(), "self_extend", group_size=3, window=12)
    check_cached_generation(model, row=0, pad=pad, cache_implementation=runnable_cache(implementation))


def test_a_left_padded_row_is_the_row_alone():
    check_padded_row_alone(hp.patch(build(), "self_extend", group_size=2, window=16), row=0, pad=11)


# Save / reload and stock transformers' refusal: tests/test_contracts.py.


def test_group_size_follows_the_target_and_the_target_its_group():
    model = hp.patch(build(), "self_extend", max_position_embeddings=4 * CTX)
    info = hp.describe(model)
    window = CTX // 4
    group = info["params"]["group_size"]
    assert info["params"]["window"] == window
    assert longest_input(group, window, CTX) >= 4 * CTX > longest_input(group - 1, window, CTX)
    hp.unpatch(model)
    hp.patch(model, "self_extend", group_size=2)
    assert hp.describe(model)["max_position_embeddings"] == longest_input(2, window, CTX)


def test_an_input_past_the_longest_is_refused():
    model = hp.patch(build(), "self_extend", group_size=2, window=16)
    with pytest.raises(hp.SequenceTooLongError, match="at most 112 tokens"):
        model(ids(113))


@pytest.mark.parametrize("params, error, pattern", [
    ({"group_size": 0}, hp.InvalidParameterError, "group_size must be >= 1"),
    ({"group_size": 2.5}, hp.ParameterTypeError, "group_size must be an int"),
    ({"group_size": 2, "window": CTX}, hp.InvalidParameterError, "window=64 must be smaller"),
    ({"group_size": 2, "window": 0}, hp.InvalidParameterError, "window must be > 0"),
    ({"group_size": 2, "window": 16, "max_position_embeddings": 200}, hp.InvalidParameterError,
     "longer than Self-Extend supports .* at most 112"),
    ({"group_size": 2, "window": 16, "factor": 4.0}, hp.InvalidParameterError, "at most 112"),
    ({}, hp.InvalidParameterError, "needs group_size= .* or a target context"),
])
def test_bad_parameters_are_refused(params, error, pattern):
    model = build()
    with pytest.raises(error, match=pattern):
        hp.patch(model, "self_extend", **params)
    assert not is_patched(model) and model.config._attn_implementation == "sdpa"


def test_models_it_cannot_serve_are_refused():
    from test_learned import tiny

    with pytest.raises(hp.MethodNotApplicableError, match="methods that apply: .*alibi"):
        hp.patch(tiny("gpt2"), "self_extend", group_size=2)
    sliding = build("mistral", sliding_window=16)
    with pytest.raises(hp.MethodNotApplicableError, match="sliding window"):
        hp.patch(sliding, "self_extend", group_size=2)
    flash = build()
    flash.config._attn_implementation = "flash_attention_2"
    with pytest.raises(hp.MethodNotApplicableError, match="sdpa or eager"):
        hp.patch(flash, "self_extend", group_size=2)
    assert not is_patched(flash)


def test_evaluation_variants_pick_the_group_from_the_target():
    from hf_posenc import eval as hpe

    model = build()
    with hpe.variant(model, "self_extend", 4 * CTX):
        group = hp.describe(model)["params"]["group_size"]
        assert longest_input(group, CTX // 4, CTX) >= 4 * CTX > longest_input(group - 1, CTX // 4, CTX)
        assert not hpe.is_length_dependent(model)
    with hpe.variant(model, "self_extend group_size=2 window=16", 4 * CTX):  # its own group: its own longest
        assert hp.describe(model)["max_position_embeddings"] == longest_input(2, 16, CTX)
    assert hpe.expand_grid("self_extend group_size=2|4") == ["self_extend group_size=2", "self_extend group_size=4"]


def test_check_length_and_the_evaluate_recipe_refuse_a_group_too_small_before_measuring(tmp_path, capsys):
    from test_eval_recipe import TEXT, recipe
    from tiny import TINY_TEXT_VOCAB, tiny_model, tiny_tokenizer

    model = hp.patch(build(), "self_extend", group_size=2, window=16)
    assert hp.describe(model)["length_limit"] == 112
    hp.check_length(model, 112)
    with pytest.raises(hp.SequenceTooLongError, match="at most 112 tokens"):
        hp.check_length(model, 113)
    tiny_model(vocab_size=TINY_TEXT_VOCAB).save_pretrained(tmp_path / "model")
    tiny_tokenizer().save_pretrained(tmp_path / "model")
    (tmp_path / "corpus").mkdir()
    for name, text in (("a.txt", TEXT), ("b.txt", TEXT[::-1])):
        (tmp_path / "corpus" / name).write_text(text)
    args = ["--model.name", str(tmp_path / "model"), "--model.dtype", "float32", "--data.corpus", str(tmp_path / "corpus"),
            "--eval.max_position_embeddings", "256", "--eval.perplexity_lengths", "16", "256",
            "--eval.perplexity_documents", "1", "--eval.tune_documents", "1", "--plots", "false"]
    with pytest.raises(SystemExit) as refused:
        recipe.main([*args, "--output_dir", str(tmp_path / "refused"), "--eval.variants", "none",
                     "--eval.grid", "self_extend group_size=4|8"])
    assert refused.value.code == 2 and not (tmp_path / "refused").exists()
    assert re.search(r"^error: .*self_extend group_size=4.*at most 208 tokens", capsys.readouterr().err, re.M)
    results = recipe.main([*args, "--output_dir", str(tmp_path / "out"), "--eval.variants", "none", "dca",
                           "self_extend", "--eval.grid", "self_extend group_size=8|16"])
    ppl = {k: v["lengths"]["perplexity"] for k, v in results["variants"].items()}
    for method in ("dca", "self_extend"):  # 16 tokens: inside a chunk and the window, the model as it was
        assert ppl[method][0] == pytest.approx(ppl["none"][0], rel=1e-5) and ppl[method][1] != ppl["none"][1]
    assert results["variants"]["dca"]["lengths"]["one_pass"]


def spread_positions(at: torch.Tensor, G: int, W: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The paper's positions for tokens at the ids `at`: true ones where the ids lie within W, else grouped."""
    i, j = torch.meshgrid(at, at, indexing="ij")
    near = i - j < W
    return torch.where(near, i, i // G + W - W // G), torch.where(near, j, j // G)


def pose_ids(n: int, seed: int, top: int) -> torch.Tensor:
    """Strictly increasing ids in [0, top): two chunks, the second moved up by a random skip (as PoSE draws)."""
    g = torch.Generator().manual_seed(seed)
    cut = int(torch.randint(1, n, (1,), generator=g))
    skip = int(torch.randint(1, top - n + 1, (1,), generator=g))
    ids = torch.arange(n)
    return torch.cat([ids[:cut], ids[cut:] + skip])


@pytest.mark.parametrize("G, W, seed", [(2, 16, 0), (3, 10, 1), (4, 20, 2), (5, 8, 3)])
def test_spread_ids_are_read_as_the_positions(G, W, seed, monkeypatch):
    """A window at PoSE's spread ids (what a fine-tune's Self-Extend teacher sees): neighbours by their ids, the
    rest grouped at id // G, against the reference's one softmax over position matrices built from the ids."""
    monkeypatch.setattr(remapped, "QUERY_BLOCK", 8)
    model = build()
    hp.patch(model, "self_extend", group_size=G, window=W)
    attention = next(m for m in model.modules() if isinstance(m, SelfExtendAttention))
    n, top = 40, longest_input(G, W, CTX)
    at = torch.stack([pose_ids(n, seed, top), pose_ids(n, seed + 10, top)])
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 4, n, 16), torch.randn(2, 2, n, 16), torch.randn(2, 2, n, 16)
    out, _ = attention(torch.nn.Module(), q, k, v, None, scaling=0.25, position_ids=at)
    cos, sin = attention.table(top, q)
    for row in range(2):
        pq, pk = spread_positions(at[row], G, W)
        expected = reference_attention(q[row:row + 1], k[row:row + 1], v[row:row + 1], cos.double(), sin.double(),
                                       pq, pk, 0.25)
        torch.testing.assert_close(out[row:row + 1].transpose(1, 2).double(), expected, atol=1e-5, rtol=1e-5)
    # the ids change the output: dropping them (token order) gives another answer
    plain, _ = attention(torch.nn.Module(), q, k, v, None, scaling=0.25)
    assert (plain - out).abs().max() > 1e-3


def test_a_model_at_spread_ids_and_at_its_token_order():
    """Through a whole model: ids 0..n-1 given are the model without ids; spread ids move the logits of the tokens
    after the skip and leave those before it as they were."""
    model = build()
    hp.patch(model, "self_extend", group_size=4, window=16)
    batch, n = ids(30), 30
    with torch.no_grad():
        plain = model(batch).logits
        torch.testing.assert_close(model(batch, position_ids=torch.arange(n)[None]).logits, plain)
        spread = torch.cat([torch.arange(10), torch.arange(10, n) + 100])[None]
        moved = model(batch, position_ids=spread).logits
    assert (moved[:, 10:] - plain[:, 10:]).abs().max() > 1e-4
    torch.testing.assert_close(moved[:, :10], plain[:, :10], atol=1e-5, rtol=1e-5)   # before the skip: as before


def test_ids_it_cannot_read_are_refused():
    model = build()
    hp.patch(model, "self_extend", group_size=4, window=16)
    batch = ids(20)
    with torch.no_grad(), pytest.raises(hp.PosEncError, match="strictly increase"):
        model(batch, position_ids=torch.cat([torch.arange(10), torch.arange(10)])[None])
    with torch.no_grad(), pytest.raises(hp.PosEncError, match="longer than Self-Extend supports"):
        model(batch, position_ids=(torch.arange(20) + 10**4)[None])
    dca = build()
    hp.patch(dca, "dca", chunk_size=32)
    with torch.no_grad(), pytest.raises(hp.PosEncError, match="cannot read other position ids"):
        dca(batch, position_ids=(torch.arange(20) * 2)[None])
    with torch.no_grad():   # its token order, given: the same as none
        torch.testing.assert_close(dca(batch, position_ids=torch.arange(20)[None]).logits, dca(batch).logits)


def test_spread_ids_with_a_padded_mask_are_read_row_by_row_not_dropped():
    """40 tokens at ids 0..19, 100..119, the first 3 padded: the padded row is the 37 tokens alone at their ids
    (before, the ids were dropped whenever a mask had padding: the logits equalled those without ids)."""
    model = build()
    hp.patch(model, "self_extend", group_size=4, window=16)
    x = ids(40)
    spread = torch.cat([torch.arange(20), torch.arange(100, 120)])[None]
    mask = torch.ones(1, 40, dtype=torch.long)
    mask[0, :3] = 0
    with torch.no_grad():
        padded = model(x, attention_mask=mask, position_ids=spread).logits[:, 3:]
        alone = model(x[:, 3:], position_ids=spread[:, 3:]).logits
        counted = model(x, attention_mask=mask).logits[:, 3:]
    torch.testing.assert_close(padded, alone)
    assert (padded - counted).abs().max() > 1e-3   # the ids change the answer: they are read
    with torch.no_grad():   # generate's ids for a padded row (its tokens counted from 0): the same as none
        generated = (mask.cumsum(-1) - 1).clamp(min=0)
        torch.testing.assert_close(model(x, attention_mask=mask, position_ids=generated).logits[:, 3:], counted)
    for bad, words in [(spread.float(), "must be integers"), (spread[:, :10], "one id per token"),
                       (torch.zeros(1, 40, dtype=torch.long), "strictly increase")]:
        with torch.no_grad(), pytest.raises(hp.PosEncError, match=words):
            model(x, attention_mask=mask, position_ids=bad)
