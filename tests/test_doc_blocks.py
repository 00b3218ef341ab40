"""Every Python block of README.md and docs/*.md runs as pasted, so a block that
fails fails CI. A block either
- runs here, on tiny models of the same shape as the ones it names, built from config: `hp.load_model` and
  `hp.load_tokenizer` give them for the embedded names (SmolLM2's 8192 positions, MiniLM's 512) and the hub
  ids the blocks name; the names a block uses without defining them (`model`, `tokenizer`, `ids`, ... that its
  page's prose gives the reader) come from GIVEN, and a block that uses a name GIVEN lacks fails by that name;
- is a worked example of docs/ARCHITECTURE.md, the text of a file of tests/examples/ that tests/conftest.py
  imports (so the whole suite runs it; tests/test_docs.py checks the block against the file);
- or follows a marker `<!-- not run: why -->` (an HTML comment: the rendered page does not show it).

The blocks list alternatives on one model, so each unpatches (or uses hp.patched) before the next patch. The
pages write files where they run (plots/, tasks/, out/): here a fresh temporary folder."""

from __future__ import annotations

import ast
import builtins
import re
from pathlib import Path
from typing import NamedTuple

import pytest
import torch
import transformers

import hf_posenc as hp
from hf_posenc import assets

from tiny import TINY_TEXT_VOCAB, tiny_model, tiny_tokenizer

pytestmark = pytest.mark.usefixtures("one_thread")   # tiny models: intra-op threads cost more than they give

ROOT = Path(__file__).resolve().parent.parent
PAGES = ["README.md", *sorted(f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(r"(?:<!--\s*not run:\s*(?P<why>.*?)\s*-->\s*\n)?^```python\n(?P<code>.*?)^```", re.M | re.S)
EXAMPLES = {p.name: p.read_text(encoding="utf-8") for p in sorted((ROOT / "tests" / "examples").glob("*.py"))}


class Block(NamedTuple):
    page: str
    index: int
    code: str
    not_run: str | None   # the marker's reason
    example: str | None   # the tests/examples file it is the text of


def page_blocks(page: str) -> list[Block]:
    found = []
    for i, m in enumerate(BLOCK.finditer((ROOT / page).read_text(encoding="utf-8"))):
        code = m["code"]
        example = next((name for name, text in EXAMPLES.items() if code.strip() and code.strip() in text), None)
        found.append(Block(page, i, code, m["why"], example))
    return found


BLOCKS = [block for page in PAGES for block in page_blocks(page)]
RUN = [b for b in BLOCKS if b.not_run is None and b.example is None]


# ---------------------------------------------------------------------------------------- the stand-ins
def tiny_causal_lm():
    """SmolLM2's shape where the blocks need it: RoPE (theta 1e5), 8192 positions; tiny_tokenizer's vocab; one
    layer of two heads, since the blocks run tens of passes of 8k-16k tokens (lm-eval, passkey, curves)."""
    return tiny_model("llama", max_position_embeddings=8192, vocab_size=TINY_TEXT_VOCAB, rope_theta=1e5,
                      num_hidden_layers=1, hidden_size=32, intermediate_size=64, num_attention_heads=2,
                      num_key_value_heads=1)


def tiny_encoder():
    """MiniLM's shape: a BERT with a 512-position learned table."""
    torch.manual_seed(0)
    config = transformers.AutoConfig.for_model("bert", hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                               intermediate_size=64, vocab_size=TINY_TEXT_VOCAB,
                                               max_position_embeddings=512)
    return transformers.AutoModel.from_config(config).eval()


MODELS = {
    "smollm2": tiny_causal_lm,
    "HuggingFaceTB/SmolLM2-135M": tiny_causal_lm,
    "minilm": tiny_encoder,
    "google/gemma-3-1b-pt": lambda: tiny_model("gemma3_text", max_position_embeddings=32768, sliding_window=512,
                                               layer_types=["sliding_attention", "full_attention"]),
}


def stand_in_model(name, *args, **kwargs):
    if str(name) not in MODELS:   # a folder the block saved: the real loader
        return REAL_LOAD_MODEL(name, *args, **kwargs)
    return MODELS[str(name)]()


def stand_in_tokenizer(name, *args, **kwargs):
    if str(name) not in MODELS:
        raise AssertionError(f"a doc block loads the tokenizer of {name!r}; give it a tiny stand-in in MODELS")
    return tiny_tokenizer()


REAL_LOAD_MODEL = hp.load_model


def hamlet_ids(n: int) -> torch.Tensor:
    return tiny_tokenizer()(assets.shakespeare_text("hamlet"), return_tensors="pt").input_ids[:, :n]


def training_arguments():
    return transformers.TrainingArguments(output_dir="trainer", report_to=[], use_cpu=True, per_device_train_batch_size=2)


# What a page's prose gives the reader before its block: name -> a tiny stand-in, made when a block uses it
GIVEN = {
    "hp": lambda: hp,
    "model": tiny_causal_lm,
    "tokenizer": tiny_tokenizer,
    "tok": tiny_tokenizer,
    "ids": lambda: hamlet_ids(256),
    "texts": lambda: [assets.shakespeare_text("hamlet")[:2000], assets.shakespeare_text("macbeth")[:2000]],
    "batch": lambda: {"input_ids": hamlet_ids(2048).repeat(2, 1)},
    "blocks": lambda: [{"input_ids": hamlet_ids(2048)[0].tolist()}] * 2,
    "args": training_arguments,
    "Trainer": lambda: transformers.Trainer,
    "DataCollatorForLanguageModeling": lambda: transformers.DataCollatorForLanguageModeling,
}


# The files a page's block reads that the reader has (a glob in the block -> files made where it runs)
GIVEN_FILES = {"notes/*.txt": {"notes/act1.txt": "To be, or not to be", "notes/act2.txt": "that is the question"}}

# The fine-tune recipe's stand-in: a shipped config as named, its embedded model swapped for the tiny one of
# the same kind, a few steps on one play (the phases and files the block shows, in seconds)
TINY_RUN = ["--train.steps", "2", "--train.save_every", "2", "--train.warmup_steps", "0",
            "--data.corpus", "shakespeare:hamlet", "--data.cache_dir", "cache"]


def stand_in_parse_config(real):
    def parse_config(argv, *args, **kwargs):
        name = real(argv, *args, **kwargs).model.name
        if name not in MODELS:
            return real(argv, *args, **kwargs)
        folder = Path("stand-ins") / name
        if not folder.exists():
            tokenizer = tiny_tokenizer()
            tokenizer.pad_token = tokenizer.eos_token   # an encoder's evaluation pads its passages
            MODELS[name]().save_pretrained(folder)
            tokenizer.save_pretrained(folder)
        return real([*argv, "--model.name", str(folder), *TINY_RUN], *args, **kwargs)
    return parse_config


def free_names(code: str) -> set[str]:
    """The names a block reads before it binds them (assignments, imports, defs, loop and `as` targets), statement
    by statement: `batch = f(batch)` reads a `batch` the reader has."""
    bound, free = set(dir(builtins)), set()
    for statement in ast.parse(code).body:
        reads, binds = set(), set()
        for node in ast.walk(statement):
            if isinstance(node, ast.Name):
                (reads if isinstance(node.ctx, ast.Load) else binds).add(node.id)
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                binds |= {(a.asname or a.name).split(".")[0] for a in node.names}
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                binds.add(node.name)
            elif isinstance(node, ast.arg):
                binds.add(node.arg)
        # an assignment reads its value first; a loop, a `with` or a def binds what its body then reads
        inner = set() if isinstance(statement, (ast.Assign, ast.AugAssign, ast.AnnAssign)) else binds
        free |= reads - bound - inner
        bound |= binds
    return free


# ---------------------------------------------------------------------------------------------- the tests
def test_every_page_with_python_has_its_blocks_found():
    """The fence pattern finds every ```python block (a block it missed would be checked by nothing)."""
    for page in PAGES:
        assert len(page_blocks(page)) == (ROOT / page).read_text(encoding="utf-8").count("```python"), page


def test_a_block_not_run_says_why():
    for block in BLOCKS:
        assert block.not_run is None or len(block.not_run.split()) >= 3, f"{block.page} block {block.index}: why not?"


def test_the_free_names_are_found():
    code = ("import a.b as c\nfrom d import e\nx = y + len(z)\nfor i in x: print(i, w)\ndef f(k): return k\n"
            "batch = c.f(batch, e, x)\n")
    assert free_names(code) == {"y", "z", "w", "batch"}


@pytest.mark.parametrize("block", RUN, ids=[f"{b.page}:{b.index}" for b in RUN])
def test_a_doc_block_runs_as_pasted(block, monkeypatch, tmp_path):
    missing = sorted(free_names(block.code) - set(GIVEN))
    assert not missing, (f"{block.page} block {block.index} uses {missing} without defining them: define them in "
                         f"the block, or give a stand-in in GIVEN (tests/test_doc_blocks.py)")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(hp, "load_model", stand_in_model)
    monkeypatch.setattr(hp, "load_tokenizer", stand_in_tokenizer)
    for auto in (transformers.AutoModelForCausalLM, transformers.AutoTokenizer):   # README's hub ids
        real = auto.from_pretrained
        fake = stand_in_model if auto is transformers.AutoModelForCausalLM else stand_in_tokenizer
        monkeypatch.setattr(auto, "from_pretrained",
                            lambda name, *a, _real=real, _fake=fake, **k: _fake(name) if name in MODELS else _real(name, *a, **k))
    from hf_posenc.recipes import finetune_config

    monkeypatch.setattr(finetune_config, "parse_config", stand_in_parse_config(finetune_config.parse_config))
    for pattern, files in GIVEN_FILES.items():
        if pattern in block.code:
            for name, text in files.items():
                Path(name).parent.mkdir(parents=True, exist_ok=True)
                Path(name).write_text(text)
    namespace = {name: GIVEN[name]() for name in free_names(block.code)}
    from accelerate.state import AcceleratorState, GradientState

    # a recipe block builds its own Accelerator: the state an earlier test in this process left is not the reader's
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    exec(compile(block.code, f"{block.page} block {block.index}", "exec"), namespace)
