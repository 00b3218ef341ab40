"""The model cards of saved folders (hf_posenc/recipes/patch_card.py, finetune_card.py): `base_model` is a hub id or
absent, and no file of a saved folder (config, card, generation config, tokenizer files) holds a machine path."""

from pathlib import Path

import pytest
import yaml

from hf_posenc import assets
from hf_posenc.cli import main as cli
from hf_posenc.recipes import search as search_recipe
from hf_posenc.recipes.patch_card import hub_id
from tiny import TINY_TEXT_VOCAB, save_text_models, tiny_model, write_corpus


def front(folder: Path) -> dict:
    text = (folder / "README.md").read_text()
    assert text.startswith("---\n")
    return yaml.safe_load(text.split("---")[1])


def machine_paths(folder: Path, *roots: Path) -> list[str]:
    """The files under `folder` that name any of `roots` (as given, resolved, or the home folder)."""
    needles = {str(r) for root in roots for r in (root, root.resolve())} | {str(Path.home())}
    return sorted(f"{f.relative_to(folder)}: {n}" for f in folder.rglob("*") if f.is_file()
                  for n in needles if n in f.read_bytes().decode("utf-8", "replace"))


def test_hub_ids_of_aliases_paths_hub_names_and_local_folders(tmp_path):
    assert hub_id("smollm2") == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert hub_id("minilm") == "sentence-transformers/all-MiniLM-L6-v2"
    assert hub_id(str(assets.smollm2_gguf())) == "HuggingFaceTB/SmolLM2-135M-Instruct"   # the alias resolved
    assert hub_id(str(assets.minilm_dir())) == "sentence-transformers/all-MiniLM-L6-v2"
    assert hub_id("Qwen/Qwen2.5-0.5B") == "Qwen/Qwen2.5-0.5B" and hub_id("gpt2") == "gpt2"
    assert hub_id("./not/there") is None
    (tmp_path / "plain").mkdir()
    assert hub_id(str(tmp_path / "plain")) is None   # a local folder with no card names no base
    (tmp_path / "carded").mkdir()
    (tmp_path / "carded" / "README.md").write_text("---\nbase_model: org/model-1\n---\n# x\n")
    assert hub_id(str(tmp_path / "carded")) == "org/model-1"   # what an hf_posenc folder says of its own base
    (tmp_path / "pathed").mkdir()
    (tmp_path / "pathed" / "README.md").write_text(f"---\nbase_model: {tmp_path}\n---\n")
    assert hub_id(str(tmp_path / "pathed")) is None   # a path is never passed on as a hub id


@pytest.fixture(scope="module")
def start(tmp_path_factory):
    root = tmp_path_factory.mktemp("machine")
    save_text_models(root, base=tiny_model(vocab_size=TINY_TEXT_VOCAB))
    return root


def test_a_patched_folder_holds_no_machine_path_and_names_no_local_base(start, tmp_path, capsys):
    cli(["patch", str(start / "base"), "--method", "yarn", "--max-position-embeddings", "256", "--out",
         str(tmp_path / "patched")])
    assert machine_paths(tmp_path / "patched", start, tmp_path) == []
    assert "base_model" not in front(tmp_path / "patched")
    assert (tmp_path / "patched" / "README.md").read_text().count("\n# base with `yarn` positions") == 1


def test_a_searched_folder_and_a_fine_tune_from_it_hold_no_machine_path(start, tmp_path):
    """The search's best/ and a fine-tune of it: the card carries the hub id the start folder's card names."""
    import test_finetune as ft

    (start / "base" / "README.md").write_text("---\nbase_model: org/tiny-base\n---\n")
    try:
        corpus = write_corpus(tmp_path / "text", "".join(f"Line {i}: the king speaks of {i * 7 % 13} ravens.\n"
                                                         for i in range(200)))
        search_recipe.main(["--model.name", str(start / "base"), "--model.dtype", "float32", "--data.corpus",
                            str(corpus), "--output_dir", str(tmp_path / "search"), "--search.target", "256",
                            "--search.budget", "1", "--search.passages", "4", "--search.passage_tokens", "16",
                            "--search.guard_length", "32", "--search.guard_share", "1", "--search.population", "4",
                            "--plots", "false"])
        best = tmp_path / "search" / "best"
        assert front(best)["base_model"] == "org/tiny-base"
        assert machine_paths(best, start, tmp_path) == []
        ft.run_recipe(ft.write_config(tmp_path / "cfg" / "c.yaml", best, posenc=None,
                                      data={"corpus": str(corpus), "cache_dir": str(tmp_path / "cache")},
                                      train={"steps": 2, "save_every": 2}, output_dir=str(tmp_path / "tuned")))
        tuned = tmp_path / "tuned"
        assert front(tuned)["base_model"] == "org/tiny-base"
        assert "rope_type" in (tuned / "README.md").read_text()   # the searched factors it carries, said
        # the run's own record (what --resume compares) names its paths as given; the model's files none
        assert [p for p in machine_paths(tuned, start, tmp_path) if not p.startswith("finetune_config.json")] == []
    finally:
        (start / "base" / "README.md").unlink()
