"""Documents kept apart (hf_posenc/train/documents.py): a packed window trained with document masking is, token for
token, the documents' own separate forwards, on every RoPE family the suite covers."""

import pytest
import torch

from hf_posenc.train import documents
from hf_posenc.errors import InvalidInputError, UnsupportedModelError
from test_rope_families import FAMILIES, build

EOS = 3
LENGTHS = (9, 24, 7)   # three documents, the second longer than the sliding windows and chunks (16); the last cut


def packed_window(vocab: int = 128, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    docs = []
    for i, n in enumerate(LENGTHS):
        doc = torch.randint(4, vocab, (n,), generator=g)
        docs.append(torch.cat([doc, torch.tensor([EOS])]) if i < len(LENGTHS) - 1 else doc)
    return docs


def test_position_ids_restart_after_each_eos_and_at_the_padding():
    docs = packed_window()
    ids = torch.cat(docs)[None].repeat(2, 1)
    mask = torch.ones_like(ids)
    mask[1, -5:] = 0   # the second row: padded at its end
    got = documents.document_position_ids(ids, mask, eos_token_id=EOS)
    expected = torch.cat([torch.arange(len(d)) for d in docs])
    assert got[0].tolist() == expected.tolist()
    assert got[1, :-5].tolist() == expected[:-5].tolist() and got[1, -5:].tolist() == list(range(5))
    assert documents.document_index(got)[0].tolist() == sum(([i] * len(d) for i, d in enumerate(docs)), [])
    empty = torch.zeros(1, 0, dtype=torch.long)   # a batch of no token: no position (an IndexError before)
    assert documents.document_position_ids(empty, empty, eos_token_id=EOS).shape == (1, 0)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_masked_window_equals_the_documents_forwards(family):
    model = build(family)
    docs = packed_window(model.config.vocab_size)
    ids = torch.cat(docs)[None]
    mask = torch.ones_like(ids)
    position_ids = documents.document_position_ids(ids, mask, eos_token_id=EOS)
    with torch.no_grad():
        with documents.kept_apart(model):
            # as a user calls it (use_cache at its default: a cache would turn transformers' packed mask off)
            packed = model(input_ids=ids, attention_mask=mask, position_ids=position_ids).logits[0]
        apart = torch.cat([model(input_ids=d[None], use_cache=False).logits[0] for d in docs])
        joined = model(input_ids=ids, attention_mask=mask, use_cache=False).logits[0]
    torch.testing.assert_close(packed, apart, atol=1e-5, rtol=1e-5)
    # and the mask is what makes it so: without it the later documents read the earlier ones
    assert (joined[len(docs[0]):] - apart[len(docs[0]):]).abs().max() > 1e-3


PER_DOCUMENT_FAMILIES = sorted(f for f in FAMILIES if documents.why_not_per_document(build(f).config, "sdpa") is None)


def test_the_families_that_attend_per_document_are_most_of_them():
    """The guard against a test over nothing: the windowed and chunked families keep SDPA's mask."""
    assert len(PER_DOCUMENT_FAMILIES) >= len(FAMILIES) // 2 and "llama" in PER_DOCUMENT_FAMILIES
    assert documents.why_not_per_document(build("mistral").config, "sdpa") == "its layers attend in windows or chunks"
    assert documents.why_not_per_document(build("llama").config, "eager") == "attention 'eager', not sdpa"


@pytest.mark.parametrize("family", PER_DOCUMENT_FAMILIES)
def test_attention_per_document_equals_the_documents_forwards_without_a_mask(family, monkeypatch):
    """Each document its own SDPA call: the documents' own logits (1e-5), and no mask is ever built (the n x n
    booleans that cost +11 % memory at 8k)."""
    from transformers import masking_utils

    model = build(family)
    docs = packed_window(model.config.vocab_size)
    ids = torch.cat(docs)[None].repeat(2, 1)
    mask = torch.ones_like(ids)
    mask[1, -4:] = 0   # the second row padded: the padding is a document of its own, which nothing reads
    position_ids = documents.document_position_ids(ids, mask, eos_token_id=EOS)
    with torch.no_grad():
        apart = torch.cat([model(input_ids=d[None], use_cache=False).logits[0] for d in docs])
        assert documents.use_per_document(model) and model.config._attn_implementation == documents.PER_DOCUMENT
        monkeypatch.setattr(masking_utils, "sdpa_mask", lambda *a, **k: pytest.fail("a mask was built"))
        with documents.kept_apart(model):
            packed = model(input_ids=ids, attention_mask=mask, position_ids=position_ids).logits
    torch.testing.assert_close(packed[0], apart, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(packed[1, :-4], apart[:-4], atol=1e-5, rtol=1e-5)


def test_attention_per_document_trains_as_the_mask_does_with_layers_recomputed():
    """The gradients of a packed window with activation checkpointing: the recomputed layers find the documents
    again from their position ids (the decoder's hook has long returned by the backward pass)."""
    grads = []
    for per_document in (False, True):
        model = build("llama")
        model.train()
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
        if per_document:
            assert documents.use_per_document(model)
        ids = torch.cat(packed_window())[None]
        position_ids = documents.document_position_ids(ids, torch.ones_like(ids), eos_token_id=EOS)
        with documents.kept_apart(model):
            logits = model(input_ids=ids, attention_mask=torch.ones_like(ids), position_ids=position_ids).logits
        torch.nn.functional.cross_entropy(logits[0, :-1], ids[0, 1:]).backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
    assert grads[0].keys() == grads[1].keys() and grads[0]
    for name in grads[0]:
        torch.testing.assert_close(grads[1][name], grads[0][name], atol=1e-5, rtol=1e-4)


def test_a_forward_without_position_ids_is_left_alone():
    model = build("llama")
    ids = torch.cat(packed_window())[None]
    with torch.no_grad():
        plain = model(input_ids=ids, use_cache=False).logits
        with documents.kept_apart(model):
            inside = model(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False).logits
    torch.testing.assert_close(inside, plain)


def test_a_window_of_one_document_is_the_plain_forward_and_its_call_output_is_not_copied(monkeypatch):
    """A window inside one document (a long package): one causal call over it, returned as SDPA's forward gave it."""
    from transformers.integrations import sdpa_attention

    model = build("llama")
    ids = torch.randint(4, 128, (1, 40), generator=torch.Generator().manual_seed(1))
    outputs = []
    real = sdpa_attention.sdpa_attention_forward

    def spy(*args, **kwargs):
        outputs.append(real(*args, **kwargs)[0])
        return outputs[-1], None

    monkeypatch.setattr(sdpa_attention, "sdpa_attention_forward", spy)
    with torch.no_grad():
        plain = model(input_ids=ids, use_cache=False).logits
        outputs.clear()
        assert documents.use_per_document(model)
        with documents.kept_apart(model):
            c = model.config
            head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
            query = torch.randn(1, c.num_attention_heads, 40, head_dim)
            key = value = torch.randn(1, c.num_key_value_heads, 40, head_dim)
            returned = documents.attend_per_document(model.model.layers[0].self_attn, query, key, value, None,
                                                     position_ids=torch.arange(40)[None])[0]
            assert len(outputs) == 1 and returned is outputs[0]
            inside = model(input_ids=ids, attention_mask=torch.ones_like(ids),
                           position_ids=torch.arange(40)[None]).logits
    torch.testing.assert_close(inside, plain, atol=1e-5, rtol=1e-5)


def test_an_explicit_empty_cache_does_not_turn_the_mask_off():
    from transformers import DynamicCache

    model = build("llama")
    docs = packed_window()
    ids = torch.cat(docs)[None]
    position_ids = documents.document_position_ids(ids, torch.ones_like(ids), eos_token_id=EOS)
    with torch.no_grad():
        with documents.kept_apart(model):
            packed = model(input_ids=ids, position_ids=position_ids, cache=DynamicCache(config=model.config)).logits[0]
        apart = torch.cat([model(input_ids=d[None]).logits[0] for d in docs])
    torch.testing.assert_close(packed, apart, atol=1e-5, rtol=1e-5)


def test_what_would_read_across_documents_is_refused():
    documents.check_model("llama", "sdpa", 4)
    documents.check_model("qwen3", "flash_attention_2", 1)
    for model_type, backend, rows, message in [("opt", "sdpa", 1, "not on 'opt'"),
                                               ("llama", "paged|sdpa", 1, "cannot keep documents apart"),
                                               ("llama", "flash_attention_2", 2, "one row only")]:
        with pytest.raises((InvalidInputError, UnsupportedModelError), match=message):
            documents.check_model(model_type, backend, rows)


@pytest.mark.parametrize("eos", [None, "</s>", 2.0, True])
def test_an_eos_that_is_not_a_token_id_is_refused(eos):
    ids = torch.tensor([[5, 2, 7, 8]])
    with pytest.raises(InvalidInputError, match="eos_token_id must be the token id"):
        documents.document_position_ids(ids, torch.ones_like(ids), eos_token_id=eos)


def spread_ids(n: int, seed: int) -> torch.Tensor:
    """n ids from 0, strictly increasing with jumps of 1 to 5: a document's spread ids (PoSE, CREAM, ...)."""
    steps = torch.randint(1, 6, (n - 1,), generator=torch.Generator().manual_seed(seed))
    return torch.cat([torch.zeros(1, dtype=torch.long), steps.cumsum(0)])


@pytest.mark.parametrize("family", PER_DOCUMENT_FAMILIES)
def test_attention_per_document_keeps_spread_ids_inside_their_document(family):
    """Ids that jump up stay in their document (its far pairs are what spread ids train); a new document starts
    where they restart: the documents' own forwards at their own ids. transformers' mask starts a new document at
    every jump, which is why spread ids inside documents need this attention."""
    model = build(family)
    docs = packed_window(model.config.vocab_size)
    each = [spread_ids(len(d), i) for i, d in enumerate(docs)]
    ids, position_ids = torch.cat(docs)[None], torch.cat(each)[None]
    with torch.no_grad():
        # each alone, with its mask: without one transformers reads a jump in the ids as a new packed sequence
        apart = torch.cat([model(input_ids=d[None], attention_mask=torch.ones_like(d[None]), position_ids=p[None],
                                 use_cache=False).logits[0] for d, p in zip(docs, each)])
        with documents.kept_apart(model):
            cut = model(input_ids=ids, attention_mask=torch.ones_like(ids), position_ids=position_ids).logits[0]
        assert documents.use_per_document(model)
        with documents.kept_apart(model):
            packed = model(input_ids=ids, attention_mask=torch.ones_like(ids), position_ids=position_ids).logits[0]
    torch.testing.assert_close(packed, apart, atol=1e-5, rtol=1e-5)
    assert (cut - apart).abs().max() > 1e-3


def documents_batch(rows: list[list[int]]) -> dict:
    from hf_posenc.train import data as train_data

    return train_data.collate(0, EOS, document_numbers=True)([{"input_ids": r} for r in rows])


def documents_of(tokens: list[int]) -> list[int]:
    """The document number of each token of a row of documents, each ended by its EOS."""
    return [sum(t == EOS for t in tokens[:i]) for i in range(len(tokens))]


def expected_spread(document: list[int], drawn: list[int]) -> tuple[list[int], list[int]]:
    """The per-document ids and scored mask of a window whose k-th token is of document `document[k]` at the drawn
    id `drawn[k]`: each document's ids less its first one here; its first token here unscored."""
    ids, scored = [], []
    for k, at in enumerate(drawn):
        first = document.index(document[k])
        ids.append(at - drawn[first])
        scored.append(int(k == 0 or first != k))
    return ids, scored


def test_spread_ids_inside_documents_are_the_schemes_own_less_each_documents_first():
    from hf_posenc.train.positions import scheme

    rows = [[5, 6, 7, EOS, 8, 9, 10, 11, 12, EOS, 13, 14, 15, 16], [20, 21, EOS, 22, 23]]   # the second padded
    batch = documents_batch(rows)
    pose = scheme("pose chunks=3", target=200)
    out = documents.spread_in_documents(batch, pose, seed=1, first_index=4, window=14)
    assert "document" not in out and torch.equal(out["input_ids"], batch["input_ids"])
    drawn = pose.position_ids(14, seed=1, index=4).tolist()
    ids, scored = expected_spread(documents_of(rows[0]), drawn)
    assert out["position_ids"][0].tolist() == ids and out["attention_mask"][0].tolist() == scored
    assert max(b - a for a, b in zip(ids, ids[1:])) > 1   # far pairs inside a document: spread, not 0..n-1
    # a row shorter than the window keeps 0..n-1, each document from 0; its padding 0, 1, ... after it
    assert out["position_ids"][1].tolist() == [0, 1, 2, 0, 1] + list(range(9))
    assert out["attention_mask"][1].tolist() == [1, 1, 1, 0, 1] + [0] * 9


def test_spread_ids_from_a_span_keep_a_document_that_ends_between_the_chunks_apart():
    """text=span: the window's tokens are taken at the drawn offsets of a target-long span; a document that ends in
    the tokens left out (its EOS not taken) ends there too: the next chunk's document restarts at 0, unscored."""
    from hf_posenc.train.positions import scheme

    tokens = [10 + i for i in range(40)]
    for end in (6, 13, 21, 30):
        tokens[end] = EOS
    pose = scheme("pose chunks=2 text=span", target=40)
    batch = documents_batch([tokens])
    split = 0
    for index in range(40):
        out = documents.spread_in_documents(batch, pose, seed=0, first_index=index, window=8)
        drawn = pose.position_ids(8, seed=0, index=index).tolist()
        ids, scored = expected_spread([documents_of(tokens)[d] for d in drawn], drawn)
        assert out["input_ids"][0].tolist() == [tokens[d] for d in drawn]
        assert out["position_ids"][0].tolist() == ids and out["attention_mask"][0].tolist() == scored
        split += any(EOS in tokens[a + 1:b] and tokens[a] != EOS for a, b in zip(drawn, drawn[1:]) if b > a + 1)
    assert split   # some draws left a document's EOS out between their chunks


def test_spreading_a_batch_without_documents_is_refused():
    from hf_posenc.train.positions import scheme

    batch = {"input_ids": torch.ones(1, 8, dtype=torch.long), "attention_mask": torch.ones(1, 8, dtype=torch.long)}
    with pytest.raises(InvalidInputError, match="no 'document' numbers"):
        documents.spread_in_documents(batch, scheme("pose", target=64), seed=0, first_index=0, window=8)
