"""Tiny models built from config: no hub, seconds each; and the helpers several test files share (a tiny
checkpoint saved with its tokenizer, a model's tensors, a free port)."""

from __future__ import annotations

import socket

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

TINY = dict(
    vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, max_position_embeddings=64, head_dim=16, tie_word_embeddings=False,
)


# Every RoPE family the registry covers (hf_posenc.families.rope_models.TESTED_MODEL_TYPES): model_type -> config
# overrides on top of TINY (and the attention implementation its contract tests use).
ROPE_FAMILIES = {
    "llama": {},
    "mistral": {"sliding_window": 16},
    "mixtral": {"num_local_experts": 4, "num_experts_per_tok": 2},
    "qwen2": {},
    "qwen3": {},
    "qwen3_moe": {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32},
    "gemma": {},
    "gemma2": {"attn_implementation": "eager", "sliding_window": 16},  # soft-capping: no sdpa
    # nested rope_parameters, one dict per layer type: only full_attention is rescaled by default
    "gemma3_text": {"layer_types": ["sliding_attention", "full_attention"], "sliding_window": 16},
    "phi": {},  # partial_rotary_factor 0.5: rotary dim 8 of head_dim 16
    "gpt_neox": {},  # partial_rotary_factor 0.25: rotary dim 4
    # its default pad_token_id is outside the tiny vocabulary; its top-level original context (4096 by
    # default) is the one transformers uses for longrope
    "phi3": {"pad_token_id": 0, "original_max_position_embeddings": TINY["max_position_embeddings"]},
    "olmo": {},
    "olmo2": {},
    "stablelm": {},  # partial_rotary_factor 0.25
    "granite": {},
    "cohere": {},  # interleaved (repeat_interleave) rotary layout
    "starcoder2": {},
    "smollm3": {"pad_token_id": 0},
    # multi-head latent attention: RoPE on a qk_rope_head_dim slice, kept apart from the rest of the head
    "deepseek_v3": {"n_routed_experts": 4, "num_experts_per_tok": 2, "n_shared_experts": 1, "moe_intermediate_size": 32,
                    "first_k_dense_replace": 1, "n_group": 1, "topk_group": 1, "kv_lora_rank": 16, "q_lora_rank": 16,
                    "qk_rope_head_dim": 8, "qk_nope_head_dim": 8, "v_head_dim": 16, "head_dim": 8,
                    # MLA expands k and v to every head, so DeepSeek's configs have as many kv heads as heads
                    # (stock transformers' SDPA fails on any float or padding mask otherwise)
                    "num_key_value_heads": 4},
    "olmo3": {"layer_types": ["sliding_attention", "full_attention"], "sliding_window": 16},  # nested, one theta
    "llama4_text": {"num_local_experts": 4, "num_experts_per_tok": 2,  # complex-valued rotary, chunked layers
                    "layer_types": ["chunked_attention", "full_attention"], "attention_chunk_size": 16},
}


def tiny_config(model_type: str = "llama", **overrides):
    kwargs = {**TINY, **overrides}
    return AutoConfig.for_model(model_type, **kwargs)


def tiny_model(model_type: str = "llama", seed: int = 0, **overrides):
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(tiny_config(model_type, **overrides), attn_implementation="sdpa")
    return model.eval()


def token_ids(n: int, batch: int = 1, vocab: int = 128, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (batch, n), generator=g)


def tiny_tokenizer():
    """A byte-level tokenizer with no merges (256 byte tokens + <eos> = id 256): any text, no hub.
    Pair it with tiny_model(vocab_size=TINY_TEXT_VOCAB)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {c: i for i, c in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>")


TINY_TEXT_VOCAB = 260


def save_text_models(folder, **models) -> None:
    """Each model saved in folder/NAME with the byte-level tokenizer (`tiny_tokenizer`): checkpoints a recipe or
    the CLI loads. Build the models with vocab_size=TINY_TEXT_VOCAB."""
    for name, model in models.items():
        model.save_pretrained(folder / name)
        tiny_tokenizer().save_pretrained(folder / name)


def write_corpus(folder, text: str):
    """Two documents, `text` and `text` reversed (a.txt, b.txt), in `folder` (made): a corpus a recipe reads."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "a.txt").write_text(text)
    (folder / "b.txt").write_text(text[::-1])
    return folder


def logits(model, ids):
    """The model's logits for `ids`, without gradients."""
    with torch.no_grad():
        return model(ids).logits


GPT2_POSITIONS = 32  # the positions of `gpt2`'s learned table


def gpt2(positions: int = GPT2_POSITIONS, seed: int = 0):
    """A tiny GPT-2 (a learned table of `positions` rows, vocabulary 100), in eval mode."""
    torch.manual_seed(seed)
    config = AutoConfig.for_model("gpt2", n_embd=32, n_layer=2, n_head=2, n_positions=positions, vocab_size=100,
                                  bos_token_id=0, eos_token_id=0)
    return AutoModelForCausalLM.from_config(config).eval()


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A tiny Llama saved with the byte-level tokenizer (`tiny_tokenizer`), as a user's checkpoint would be."""
    path = tmp_path_factory.mktemp("tiny")
    tiny_model(vocab_size=TINY_TEXT_VOCAB).save_pretrained(path)
    tiny_tokenizer().save_pretrained(path)
    return path


def state(model):
    """The model's tensors, cloned."""
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
