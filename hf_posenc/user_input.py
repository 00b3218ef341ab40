"""What a front end (the `hf-posenc` command, the recipes) checks of a user's input before anything loads,
and how it refuses: one line `error: ...` on stderr and exit code 2. The CLI and the evaluate recipe both use
it, so neither imports the other for it."""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import uuid
from pathlib import Path
from typing import NoReturn

import yaml

try:
    import fcntl   # POSIX: a run's folder locked while it runs (folder_lock)
except ImportError:   # Windows
    fcntl = None

from . import assets
from .errors import MethodNotApplicableError, PosEncError, UnsupportedModelError

INPUT_ERRORS = (PosEncError, ValueError, OSError, yaml.YAMLError)  # what a user's input can cause


class UsageError(ValueError):
    """A command-line value the command cannot use; the message names it and says what is allowed."""


def refuse(err: object) -> NoReturn:
    """One line `error: ...` on stderr and exit code 2 (argparse's code for a usage error)."""
    print(f"error: {' '.join(str(err).split())}", file=sys.stderr)
    raise SystemExit(2)


@contextlib.contextmanager
def refusals():
    """Input errors raised inside the block end the program as `refuse` does (for the CLI and the recipes)."""
    try:
        yield
    except BrokenPipeError:   # the reader left (`--help | head`): not an input error; stop writing, quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        raise SystemExit(1) from None
    except INPUT_ERRORS as err:
        refuse(err)
    except OverflowError as err:  # a number so large that a context computed from it overflows
        refuse(f"a number given is too large to use ({err})")


@contextlib.contextmanager
def reading(path):
    """Any exception raised while transformers reads the user's file `path` (a GGUF whose tensors do not
    make the model its header describes: a RuntimeError deep in loading; one cut short in its tensor data: numpy's
    ValueError) is a refusal naming the file; the project's own refusals pass as they are."""
    try:
        yield
    except (PosEncError, UsageError):
        raise
    except Exception as err:
        if isinstance(err, OSError) and not Path(path).exists():   # a hub id the hub did not serve: said as such
            raise
        raise UsageError(f"{path}: cannot be loaded as a model ({type(err).__name__}: {err})") from err


def model_ref(ref: str, gguf_file: str | None = None) -> str:
    """The model argument, aliases resolved, checked before anything loads: a local path must be a model
    folder (config.json, or the file --gguf-file names) or a .gguf file. A hub id passes through."""
    if not ref.strip():
        raise UsageError("the model is empty; give a hub id, a folder, a .gguf file, or smollm2 / minilm")
    given, ref = ref, assets.resolve_alias(ref)
    if ref.endswith(".gguf") or gguf_file:  # without the gguf package: the install command, not an ImportError
        from . import loading

        loading.require_gguf(given, ref if not gguf_file else os.path.join(ref, gguf_file))
    path = Path(ref).expanduser()
    # hub ids are NAME or ORG/NAME; anything else is a path
    if not (path.exists() or ref.startswith((".", "/", "~")) or ref.endswith(".gguf") or ref.count("/") > 1):
        return ref
    if not path.exists():
        raise UsageError(f"model {ref!r}: no such file or folder")
    if path.is_file():
        if path.suffix != ".gguf" or gguf_file:
            raise UsageError(f"model {ref!r} is a file; give a model folder (with config.json) or a .gguf file")
    elif gguf_file:
        if not (path / gguf_file).is_file():
            raise UsageError(f"--gguf-file {gguf_file!r}: no such file in {ref}")
    elif not (path / "config.json").is_file():
        raise UsageError(f"model folder {ref!r} has no config.json: not a Hugging Face model folder")
    return str(path)


def first_names(names: list[str], most: int = 3) -> str:
    """The first `most` of `names`, then ", ..." where there are more: what a refusal shows of a folder's files."""
    return ", ".join(names[:most]) + (", ..." if len(names) > most else "")


def output_folder(out: str, flag: str, inputs=(), *, replaces: bool = False) -> Path:
    """`out` as a folder to write to, checked before anything loads: not a file, not under a file, not an
    input nor inside one, and (when `replaces`: the folder is replaced whole) containing no input nor the
    current folder."""
    if not out.strip():
        raise UsageError(f"{flag} is empty; name a folder")
    path = Path(out).expanduser().resolve()
    if path.exists() and not path.is_dir():
        raise UsageError(f"{flag} {out} is a file; name a folder")
    blocked = next((p for p in path.parents if p.exists() and not p.is_dir()), None)
    if blocked is not None:
        raise UsageError(f"{flag} {out} lies under {blocked}, which is a file")
    for source in inputs:
        source = Path(source).expanduser().resolve()
        if path == source or source in path.parents:
            raise UsageError(f"{flag} {out} is or lies inside the input {source}; write somewhere else")
        if replaces and path in source.parents:
            raise UsageError(f"{flag} {out} contains the input {source}, which replacing it would delete; "
                             f"write somewhere else")
    if replaces and (path == Path.cwd() or path in Path.cwd().parents):
        raise UsageError(f"{flag} {out} is or contains the current folder; name a new folder")
    return path


@contextlib.contextmanager
def folder_lock(folder: Path, what: str):
    """`folder` (it exists) for this process alone while the block runs: a second process asking for it is refused
    naming `what`. An advisory lock on the folder itself (no file is written); the system lets go of it when the
    process ends, killed or not. Where the system has no such lock (Windows; NFS or Lustre without flock) the
    block runs unguarded."""
    fd = os.open(folder, os.O_RDONLY) if fcntl is not None else None
    try:
        if fd is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise UsageError(f"{what} is in use: another process runs in it now; let it finish (or stop it), "
                                 f"then run this command again to go on from where it stopped") from None
            except OSError:   # no flock on this file system (EBADF on NFS, ENOSYS, ENOLCK): unguarded
                pass
        yield
    finally:
        if fd is not None:
            os.close(fd)


@contextlib.contextmanager
def replacing(out: Path):
    """A fresh folder beside `out` to write into; when the block succeeds it takes `out`'s place by renames,
    so `out` never mixes old and new files (a previous model's tokenizer, shards or index), and a failed
    write leaves `out` as it was."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp-{uuid.uuid4().hex[:8]}")
    tmp.mkdir()
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    old = out.with_name(f".{out.name}.old-{uuid.uuid4().hex[:8]}")
    if out.exists():
        os.replace(out, old)
    os.replace(tmp, out)
    shutil.rmtree(old, ignore_errors=True)


def _input_paths(ref: str, gguf_file: str | None) -> list[Path]:
    """The local files a command reads: the model folder, or the .gguf file (a sibling folder is fine)."""
    path = Path(ref)
    return [path / gguf_file if gguf_file else path] if path.exists() else []


def model_mechanism(ref: str, gguf_file: str | None = None, methods=()) -> tuple[str, str]:
    """(positional mechanism, model type) from the model's config alone (no weights), each of `methods`
    checked to apply to it: these refusals come before the weights load."""
    from . import loading

    skeleton = loading.meta_model(ref, gguf_file=gguf_file)
    return _check_methods(skeleton, methods), skeleton.config.model_type


def model_skeleton(ref: str, gguf_file: str | None = None, methods=(), causal_lm_for: str = ""):
    """The model's skeleton (meta device: modules and config, no weights), each of `methods` checked to apply to
    it and, when `causal_lm_for` names what needs it, checked to be a causal LM: refused before the weights load."""
    from . import loading

    skeleton = loading.meta_model(ref, gguf_file=gguf_file)
    if causal_lm_for and not is_causal_lm(skeleton):
        config = skeleton.config
        raise UnsupportedModelError(
            f"model {ref!r} is a {type(skeleton).__name__} ({config.model_type}"
            f"{', an encoder-decoder' if getattr(config, 'is_encoder_decoder', False) else ''}), not a causal LM; "
            f"{causal_lm_for} scores each next token from the tokens before it, so it needs a causal LM (Llama, "
            f"GPT-2, SmolLM2, ...)")
    _check_methods(skeleton, methods)
    return skeleton


def is_causal_lm(skeleton) -> bool:
    """Whether a model (its skeleton is enough) predicts each next token from the ones before: a decoder with a
    language-model head. An encoder (BertModel, a masked LM) or an encoder-decoder is not one."""
    if getattr(skeleton.config, "is_encoder_decoder", False) or skeleton.get_output_embeddings() is None:
        return False
    return type(skeleton).__name__.endswith(("ForCausalLM", "LMHeadModel", "ForConditionalGeneration"))


def _check_methods(skeleton, methods) -> str:
    """The skeleton's positional mechanism, each of `methods` checked to apply to it."""
    from .registry import find_family, get_method, methods_for

    mechanism = find_family(skeleton).mechanism
    for method in methods:
        if mechanism not in get_method(method).mechanisms:
            raise MethodNotApplicableError(
                f"method {method!r} applies to {'/'.join(get_method(method).mechanisms)} positions, but this "
                f"{skeleton.config.model_type} model uses {mechanism} positions; methods that apply: "
                f"{', '.join(methods_for(mechanism))}")
    return mechanism
