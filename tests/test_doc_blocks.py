"""The code blocks of the method pages run as pasted (issue 23, 14d): each lists alternatives on one model, so
each unpatches (or uses hp.patched) before the next patch instead of failing at its second line with
AlreadyPatchedError. `hp.load_model` gives tiny models of the same shape as the ones the blocks name (SmolLM2's
8192 positions, MiniLM's 512), built from config: no hub, no assets."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
import transformers

import hf_posenc as hp

from tiny import tiny_model

ROOT = Path(__file__).resolve().parent.parent
PAGES = ["docs/rope_methods.md", "docs/learned_tables.md", "docs/attention_methods.md"]
BLOCKS = [(page, i, code) for page in PAGES
          for i, code in enumerate(re.findall(r"```python\n(.*?)```", (ROOT / page).read_text(), re.S))]


def tiny_load_model(name, **kwargs):
    if name == "smollm2":
        return tiny_model("llama", max_position_embeddings=8192)
    if name == "minilm":
        torch.manual_seed(0)
        config = transformers.AutoConfig.for_model("bert", hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                                   intermediate_size=64, vocab_size=100, max_position_embeddings=512)
        return transformers.AutoModel.from_config(config).eval()
    if name == "google/gemma-3-1b-pt":  # per-layer-type RoPE: sliding and full-attention layers
        return tiny_model("gemma3_text", max_position_embeddings=32768, sliding_window=512,
                          layer_types=["sliding_attention", "full_attention"])
    raise AssertionError(f"a doc block loads {name!r}; give it a tiny stand-in here")


def test_the_pages_have_blocks():
    assert {page for page, _, _ in BLOCKS} == set(PAGES)


@pytest.mark.parametrize("page,index,code", BLOCKS, ids=[f"{p}:{i}" for p, i, _ in BLOCKS])
def test_a_doc_block_runs_as_pasted(page, index, code, monkeypatch):
    monkeypatch.setattr(hp, "load_model", tiny_load_model)
    exec(compile(code, f"{page} block {index}", "exec"), {})
