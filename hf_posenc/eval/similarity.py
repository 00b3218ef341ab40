"""How close an encoder's sentence embeddings stay to another's (a patched encoder against the original):
mean cosine of mean-pooled embeddings on held-out passages."""

from __future__ import annotations

import re

import torch
import torch.nn.functional as F


def held_out_passages(texts, n: int, min_words: int = 8) -> list[str]:
    """Paragraphs (split at blank lines) of at least `min_words` words, the first n."""
    out = []
    for text in texts:
        for para in re.split(r"\n\s*\n", text):
            para = " ".join(para.split())
            if len(para.split()) >= min_words:
                out.append(para)
                if len(out) == n:
                    return out
    return out


@torch.no_grad()
def embedding_cosine(model, reference, tokenizer, passages: list[str], max_length: int, batch: int = 16) -> float:
    """Mean cosine similarity of the mean-pooled sentence embeddings of two encoders."""
    sims = []
    for i in range(0, len(passages), batch):
        enc = tokenizer(passages[i:i + batch], padding=True, truncation=True, max_length=max_length,
                        return_tensors="pt").to(next(model.parameters()).device)
        a, b = (mean_pool(m(**enc).last_hidden_state, enc["attention_mask"]) for m in (model, reference))
        sims.append(F.cosine_similarity(a.float(), b.float(), dim=-1))
    return torch.cat(sims).mean().item()


def mean_pool(hidden, mask):
    mask = mask[..., None].to(hidden.dtype)
    return (hidden * mask).sum(1) / mask.sum(1).clamp(min=1)
