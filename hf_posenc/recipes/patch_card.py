"""What a saved patched folder tells the tools that read it: the tokenizer's `model_max_length` (what
pipelines, lm-eval and serving front ends truncate to) and a README that says what was patched and how to
load it. A fine-tuned folder's card: finetune_card.py beside it. Both are the front ends' (`hf-posenc patch`, the
search's best folder, the fine-tune's output)."""

from __future__ import annotations

import json

import torch

from .. import api
from ..export import serving
from ..errors import PosEncError
from ..record_reader import read_record

# methods whose saved config stock transformers builds as patched (the others need hp.from_pretrained)
STOCK_METHODS = serving.STOCK_METHODS + serving.TABLE_METHODS


def fit_tokenizer(tokenizer, model: torch.nn.Module) -> None:
    """Set the tokenizer's `model_max_length` to the patched context (it keeps the original one otherwise)."""
    if read_record(model.config) is not None:
        tokenizer.model_max_length = int(api.describe(model)["max_position_embeddings"])


def patch_card(model: torch.nn.Module, base: str) -> str:
    """README.md for a folder holding `model` patched from `base` (no training)."""
    info = api.describe(model)
    method = info["method"]
    stock = method in STOCK_METHODS
    load = ("`transformers.AutoModelForCausalLM.from_pretrained(folder)` (stock config: the patch is in it), or "
            "`hf_posenc.from_pretrained(folder)` (the same model, and `hp.unpatch` works on it)" if stock else
            "`hf_posenc.from_pretrained(folder)` only: stock transformers cannot express this method and refuses "
            "the folder (it never loads a different model silently)")
    lines = [
        "---", f"base_model: {base}", "library_name: transformers", "tags: [hf_posenc, long-context]", "---",
        f"# {base} with `{method}` positions", "",
        f"Patched with hf_posenc, no training: `hp.patch(model, {method!r}, "
        + ", ".join(f"{k}={v!r}" for k, v in {"max_position_embeddings": info["max_position_embeddings"],
                                              **(info.get("params") or {})}.items() if v is not None) + ")`.", "",
        f"- **Context**: {info.get('original_max_position_embeddings')} -> {info['max_position_embeddings']} tokens "
        f"(factor {info.get('factor')}); the tokenizer's `model_max_length` says the new one.",
        f"- **Mechanism after the patch**: `{json.dumps({k: v for k, v in info.items() if k != 'params'}, default=str)}`",
        f"- **Load**: {load}.",
    ]
    try:
        lines.append(f"- **vLLM, from the original checkpoint**: "
                     f"`--hf-overrides '{json.dumps(serving.serving_overrides(model))}'`")
        lines.append(f"- **llama.cpp, from the original GGUF**: `{' '.join(serving.llama_cpp_args(model))}`")
    except PosEncError:
        pass  # not expressible by that engine: hf_posenc.export.serving says why when asked
    return "\n".join(lines) + "\n"
