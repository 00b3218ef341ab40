"""What a saved patched folder tells the tools that read it: the tokenizer's `model_max_length` (what
pipelines, lm-eval and serving front ends truncate to) and a README that says what was patched and how to
load it. A fine-tuned folder's card: finetune_card.py beside it. Both are the front ends' (`hf-posenc patch`, the
search's best folder, the fine-tune's output)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch
import yaml

from .. import api, assets
from ..export import serving
from ..errors import PosEncError
from ..record_reader import read_record

HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?")   # NAME or ORG/NAME
# methods whose saved config stock transformers builds as patched (the others need hp.from_pretrained)
STOCK_METHODS = serving.STOCK_METHODS + serving.TABLE_METHODS


def fit_tokenizer(tokenizer, model: torch.nn.Module) -> None:
    """Set the tokenizer's `model_max_length` to the patched context (it keeps the original one otherwise)."""
    if read_record(model.config) is not None:
        tokenizer.model_max_length = int(api.describe(model)["max_position_embeddings"])


def carried_rope(config) -> dict:
    """The RoPE scaling a stock config carries with no hf_posenc patch (a searched `longrope` folder, a checkpoint
    that ships YaRN), as a card shows it: rope_type and factor, the factor sets as their range ({}: plain RoPE)."""
    from .. import _compat

    text = config.get_text_config()
    if not isinstance(getattr(text, "rope_parameters", None), dict):   # a learned table, a bias: no RoPE
        return {}
    found = {}
    for layer in _compat.rope_layer_types(text):
        params = dict(_compat.get_rope_parameters(text, layer) or {})
        if params.get("rope_type", "default") == "default":
            continue
        for key in ("short_factor", "long_factor"):
            if isinstance(params.get(key), list) and params[key]:
                values = params[key]
                params[key] = f"{len(values)} pairs, {min(values):.4g} to {max(values):.4g}"
        found[layer or "all"] = params
    return found.get("all", found)


def hub_id(ref: str) -> str | None:
    """The hub id of the model `ref` names, for a card's `base_model`: an embedded model's (smollm2, minilm, or the
    path they resolve to), a hub id itself, or for a local folder the `base_model` its own card names (a folder
    hf_posenc saved: a search's best, a fine-tune); None for a local folder with none. Never a machine path."""
    ref = str(ref)
    alias = assets.alias_of(ref)
    if alias is not None:
        return assets.HUB_IDS[alias]
    path = Path(ref).expanduser()
    if not path.exists():
        return ref if HUB_ID.fullmatch(ref) else None
    card = (path if path.is_dir() else path.parent) / "README.md"
    if card.is_file():
        head = card.read_text(encoding="utf-8", errors="replace").split("---")
        if len(head) > 2 and not head[0].strip():   # YAML front matter
            try:
                meta = yaml.safe_load(head[1])
            except yaml.YAMLError:
                return None
            found = meta.get("base_model") if isinstance(meta, dict) else None
            return found if isinstance(found, str) and HUB_ID.fullmatch(found) else None
    return None


def base_name(ref: str) -> str:
    """How a card names the model it was made from: its hub id, else the folder's or file's own name."""
    path = Path(str(ref)).expanduser()
    return hub_id(ref) or (path.resolve().name if path.exists() else path.name)   # `.`: the folder's own name


def front_matter(ref: str) -> list[str]:
    """A card's YAML header: `base_model` only where the base has a hub id (a local path breaks the hub's link and
    tells readers about the machine it was made on)."""
    found = hub_id(ref)
    return ["---", *([f"base_model: {found}"] if found else []), "library_name: transformers",
            "tags: [hf_posenc, long-context]", "---"]


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
        *front_matter(base), f"# {base_name(base)} with `{method}` positions", "",
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
