"""Documents kept apart (hf_posenc/documents.py): a packed window trained with document masking is, token for
token, the documents' own separate forwards, on every RoPE family the suite covers."""

import pytest
import torch

from hf_posenc import documents
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


def test_a_forward_without_position_ids_is_left_alone():
    model = build("llama")
    ids = torch.cat(packed_window())[None]
    with torch.no_grad():
        plain = model(input_ids=ids, use_cache=False).logits
        with documents.kept_apart(model):
            inside = model(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False).logits
    torch.testing.assert_close(inside, plain)


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
