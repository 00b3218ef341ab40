"""A folder hf_posenc saves is read by transformers 4.x (what vLLM 0.11 and other 4.x stacks load) as the model
hf_posenc scored: the same cos and sin at a length inside the original context and one past it, to 1e-6, or a
loud refusal where 4.x has no form for the patch. Runs transformers 4.57 itself, in the environment
scripts/setup.sh makes (HF_POSENC_TRANSFORMERS4 names another python); skipped where there is none."""

import json
import os
import subprocess
from pathlib import Path

import pytest
import torch

import hf_posenc as hp
from tiny import tiny_model

ORIGINAL, TARGET, SHORT, LONG = 64, 256, 48, 200
LONG_FACTOR = [1.0, 1.0, 1.2, 1.7, 2.5, 3.4, 4.0, 4.6]
PYTHON = os.environ.get("HF_POSENC_TRANSFORMERS4") or str(
    Path(os.environ.get("HF_POSENC_TRANSFORMERS4_ENV") or Path.home() / ".cache" / "hf_posenc" / "transformers4")
    / "bin" / "python")

pytestmark = pytest.mark.skipif(not Path(PYTHON).is_file(), reason=f"no transformers 4.x environment at {PYTHON} "
                                                                    f"(scripts/setup.sh makes it)")

PATCHES = {
    "yarn": ("yarn", {}),
    "linear": ("linear", {}),
    "ntk": ("ntk", {}),
    "llama3": ("llama3", {}),
    "longrope_switched": ("longrope", {"long_factor": LONG_FACTOR}),
    "longrope_static": ("longrope", {"long_factor": LONG_FACTOR, "short_factor": LONG_FACTOR,
                                     "attention_factor": 1.12}),
}


# A RoPE per layer type (full layers patched, sliding layers plain): 4.x keeps it in family-specific keys.
LAYER_TYPE_PATCHES = {"gemma3_yarn": ("gemma3_text", "yarn"), "gemma3_ntk": ("gemma3_text", "ntk"),
                      "olmo3_yarn": ("olmo3", "yarn")}
LAYER_TYPES = ["sliding_attention", "full_attention"]


def rope_of(model, n: int, layer_type: str = "all") -> tuple[torch.Tensor, torch.Tensor]:
    args = () if layer_type == "all" else (layer_type,)
    with torch.no_grad():
        cos, sin = model.model.rotary_emb(torch.zeros(1, 1), torch.arange(n)[None], *args)
    return cos[0], sin[0]


def read_with_transformers4(folders: list[Path]) -> dict:
    done = subprocess.run([PYTHON, str(Path(__file__).with_name("transformers4_rope.py")), f"{SHORT},{LONG}",
                           *map(str, folders)], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "TRANSFORMERS_VERBOSITY": "error"})
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["version"].startswith("4."), out["version"]
    return out["folders"]


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """Each patch saved as a user saves it, the unpatched model loaded and saved again, and a fine-tuned folder
    (a saved yarn folder loaded, its weights changed, saved again): the models hf_posenc scored, by name."""
    root = tmp_path_factory.mktemp("saved")
    models = {}
    for name, (method, params) in PATCHES.items():
        model = tiny_model(rope_theta=50000.0)
        hp.patch(model, method, max_position_embeddings=TARGET, **params)
        model.save_pretrained(root / name)
        models[name] = model
    tiny_model(rope_theta=50000.0).save_pretrained(root / "plain_source")
    models["unpatched"] = hp.load_model(str(root / "plain_source"))
    models["unpatched"].save_pretrained(root / "unpatched")
    tuned = hp.from_pretrained(str(root / "yarn"))
    with torch.no_grad():
        tuned.model.layers[0].mlp.up_proj.weight.mul_(1.01)
    tuned.save_pretrained(root / "finetuned")
    models["finetuned"] = tuned
    attention = tiny_model(rope_theta=50000.0)
    hp.patch(attention, "self_extend", group_size=4, window=16)
    attention.save_pretrained(root / "self_extend")
    dynamic = tiny_model(rope_theta=50000.0)
    hp.patch(dynamic, "dynamic", max_position_embeddings=TARGET)
    dynamic.save_pretrained(root / "dynamic")
    partial = tiny_model("phi", rope_theta=50000.0, partial_rotary_factor=0.5)   # half of each head rotated
    hp.patch(partial, "yarn", max_position_embeddings=TARGET)
    partial.save_pretrained(root / "partial_yarn")
    models["partial_yarn"] = partial
    for name, (model_type, method) in LAYER_TYPE_PATCHES.items():
        model = tiny_model(model_type, layer_types=LAYER_TYPES)
        hp.patch(model, method, max_position_embeddings=TARGET)
        model.save_pretrained(root / name)
        models[name] = model
    names = [*PATCHES, "unpatched", "finetuned", "self_extend", "dynamic", "partial_yarn", *LAYER_TYPE_PATCHES]
    return models, read_with_transformers4([root / n for n in names]), root


@pytest.mark.parametrize("name", [*PATCHES, "unpatched", "finetuned", "partial_yarn", *LAYER_TYPE_PATCHES])
def test_transformers4_builds_the_rope_hf_posenc_scored(saved, name):
    models, read, root = saved
    got = read[str(root / name)]
    assert "error" not in got, got.get("error")
    assert set(got["rope"]) == ({"all"} if name not in LAYER_TYPE_PATCHES else set(LAYER_TYPES))
    for layer_type, rope in got["rope"].items():
        for n in (SHORT, LONG):
            cos, sin = rope_of(models[name], n, layer_type)
            torch.testing.assert_close(torch.tensor(rope["cos"][str(n)]), cos, atol=1e-6, rtol=0)
            torch.testing.assert_close(torch.tensor(rope["sin"][str(n)]), sin, atol=1e-6, rtol=0)


def test_a_rope_per_layer_type_4x_cannot_hold_is_said_at_the_patch(tmp_path):
    """OLMo 3 in 4.x runs its sliding layers at the full layers' rope_theta: a patch that moves only the full
    layers' base (ntk) has no 4.x form, and the user is told where it happens, not when a 4.x engine serves it."""
    model = tiny_model("olmo3", layer_types=LAYER_TYPES)
    with pytest.warns(UserWarning, match="no form for this olmo3 RoPE") as caught:
        hp.patch(model, "ntk", max_position_embeddings=TARGET)
    assert caught[0].filename == __file__   # names the user's line, not hf_posenc's
    model.save_pretrained(tmp_path / "olmo3_ntk")
    got = read_with_transformers4([tmp_path / "olmo3_ntk"])[str(tmp_path / "olmo3_ntk")]
    cos, _ = rope_of(model, LONG, "full_attention")
    assert (torch.tensor(got["rope"]["full_attention"]["cos"][str(LONG)]) - cos).abs().max() > 1e-2


@pytest.mark.parametrize("name", ["self_extend", "dynamic"])
def test_transformers4_refuses_a_patch_it_cannot_run_instead_of_running_another_model(saved, name):
    _, read, root = saved
    got = read[str(root / name)]
    assert "error" in got and "hf_posenc_" in got["error"], got.get("rope_type")


def test_a_save_without_the_legacy_keys_is_read_as_another_model(saved, tmp_path):
    """The reason the keys are written: the same yarn folder without them is rope_theta 10000 and no scaling in 4.x
    (this test fails if transformers 4.x ever reads rope_parameters)."""
    models, _, root = saved
    config = json.loads((root / "yarn" / "config.json").read_text())
    for key in ("rope_scaling", "rope_theta"):
        config.pop(key)
    folder = tmp_path / "stripped"
    models["yarn"].save_pretrained(folder)
    (folder / "config.json").write_text(json.dumps(config))
    got = read_with_transformers4([folder])[str(folder)]
    assert got["rope_type"] == "default" and got["rope_theta"] == 10000.0
    cos, _ = rope_of(models["yarn"], LONG)
    assert (torch.tensor(got["rope"]["all"]["cos"][str(LONG)]) - cos).abs().max() > 1e-2
