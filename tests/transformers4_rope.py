"""Run by tests/test_transformers4.py in an environment with transformers 4.x (scripts/setup.sh makes one): load
each saved folder named on the command line as that release does, and print, as one JSON object, the RoPE it
builds (the rotary module's cos and sin at the lengths given, its rope_type) or the error it raises."""

import json
import sys

import torch
import transformers
from transformers import AutoModelForCausalLM


def read(folder: str, lengths: list[int]) -> dict:
    try:
        model = AutoModelForCausalLM.from_pretrained(folder, torch_dtype=torch.float32).eval()
    except Exception as error:   # what 4.x says of a folder it cannot load: the test reads the message
        return {"error": f"{type(error).__name__}: {error}"}
    x = torch.zeros(1, 1, dtype=torch.float32)
    rotaries = layer_type_rotaries(model.model)
    out = {"rope_type": rotaries["all"].rope_type if "all" in rotaries else None,
           "rope_theta": model.config.rope_theta, "rope": {}}
    with torch.no_grad():
        for layer_type, rotary in rotaries.items():
            rope = out["rope"][layer_type] = {"cos": {}, "sin": {}}
            for n in lengths:
                cos, sin = rotary(x, torch.arange(n)[None])
                rope["cos"][n], rope["sin"][n] = cos[0].tolist(), sin[0].tolist()
    return out


def layer_type_rotaries(inner) -> dict:
    """The rotary modules 4.x builds, by the layer type they serve ("all" where one serves every layer)."""
    if hasattr(inner, "rotary_embs"):   # OLMo 3
        return dict(inner.rotary_embs)
    if hasattr(inner, "rotary_emb_local"):   # Gemma 3 and 3n
        return {"full_attention": inner.rotary_emb, "sliding_attention": inner.rotary_emb_local}
    return {"all": inner.rotary_emb}


if __name__ == "__main__":
    lengths = [int(n) for n in sys.argv[1].split(",")]
    print(json.dumps({"version": transformers.__version__,
                      "folders": {f: read(f, lengths) for f in sys.argv[2:]}}))
