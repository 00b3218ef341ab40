"""Load a model from a hub id, a local folder or a GGUF file, ready to patch and save."""

from __future__ import annotations

import contextlib
import difflib
import hashlib
import json
import os
import shutil
from pathlib import Path

import transformers

from . import _compat, assets, registry
from .export import gguf_header, serving
from .errors import InvalidInputError, ModelNotFoundError, ParameterTypeError, PosEncError

CACHE_DIR = Path(os.environ.get("HF_POSENC_CACHE", Path.home() / ".cache" / "hf_posenc"))
GGUF_INSTALL = "pip install gguf (or pip install 'hf_posenc[gguf]')"


class MissingPackageError(PosEncError, ImportError):
    """An optional package that reading this model needs is not installed; the message says how to install it."""


def require_gguf(ref: str | os.PathLike, path: str | os.PathLike | None = None) -> None:
    """Refuse, naming the install command, to read a GGUF file (`ref`, at `path`) without the gguf package
    (transformers would end in an ImportError traceback)."""
    try:
        import gguf  # noqa: F401
    except ImportError:
        alias = f"{ref!r} (the embedded model, {path})" if str(ref) in assets.ALIASES else f"{path or ref}"
        raise MissingPackageError(f"{alias} is a GGUF file, and reading one needs the gguf package, which is not "
                                  f"installed: {GGUF_INSTALL}") from None


@contextlib.contextmanager
def _hub_hint(ref):
    """A hub lookup that fails for a name close to an embedded model's alias says so (`smolllm2`: offline,
    transformers' "couldn't connect" names no alternative)."""
    try:
        yield
    except OSError as err:
        name = str(ref)
        close = difflib.get_close_matches(name.lower(), list(assets.ALIASES), n=1, cutoff=0.7)
        if not close or name in assets.ALIASES or os.path.exists(name):
            raise
        first = (str(err).strip().splitlines() or [type(err).__name__])[0].rstrip(".")
        raise ModelNotFoundError(f"no model {name!r}: it is not a local path, and as a hub id: {first}. Did you mean "
                                 f"{close[0]!r}? The embedded models are {' and '.join(assets.ALIASES)}") from err


def resolve(ref: str | os.PathLike, gguf_file: str | None = None, *, model: bool = True) -> tuple[str, dict]:
    """(name_or_path, extra from_pretrained kwargs) for a hub id, a folder, a `.gguf` file, or `smollm2` /
    `minilm` (the embedded models, as on the command line). A path that does not exist, or (for a model,
    not a tokenizer) a folder without config.json, is refused here rather than as a hub lookup."""
    if not isinstance(ref, (str, os.PathLike)):
        raise ParameterTypeError(f"a model is a hub id, a local folder, a .gguf file or smollm2 / minilm (a str or a "
                                 f"path), got {ref!r}")
    if not str(ref).strip():
        raise ModelNotFoundError("the model reference is empty; give a hub id, a local folder, a .gguf file or "
                                 "smollm2 / minilm")
    given = ref
    try:  # a name, not a Path object, may be an embedded model's
        ref = assets.resolve_alias(ref) if isinstance(ref, str) else str(ref)
    except FileNotFoundError as err:  # the alias's asset package is not installed: say how to install it
        raise ModelNotFoundError(f"{ref!r} names an embedded model, but {err}") from None
    if gguf_file or ref.endswith(".gguf"):
        require_gguf(given, os.path.join(ref, gguf_file) if gguf_file else ref)
    if gguf_file is None and ref.endswith(".gguf"):
        if not os.path.isfile(ref):
            raise ModelNotFoundError(f"GGUF file not found: {ref}")
        return os.path.dirname(os.path.abspath(ref)), {"gguf_file": os.path.basename(ref)}
    if os.path.isfile(ref):
        raise ModelNotFoundError(f"{ref} is a file; a model is a folder holding config.json, a .gguf file or a hub id")
    if gguf_file and os.path.isdir(ref) and not os.path.isfile(os.path.join(ref, gguf_file)):
        raise ModelNotFoundError(f"GGUF file not found: {os.path.join(ref, gguf_file)}")
    if model and os.path.isdir(ref) and not gguf_file and not os.path.isfile(os.path.join(ref, "config.json")):
        adapter = os.path.isfile(os.path.join(ref, "adapter_config.json"))
        raise ModelNotFoundError(f"{ref} is a folder without config.json: not a saved model (model.save_pretrained "
                                 f"writes one)" + ("; it holds a PEFT adapter: load its base model, then "
                                                   "peft.PeftModel.from_pretrained(model, folder)" if adapter else ""))
    if not os.path.exists(ref) and (os.path.isabs(ref) or ref.startswith((".", "~")) or ref.count("/") > 1):
        raise ModelNotFoundError(f"no model at {ref}: the path does not exist (a hub id is NAME or ORG/NAME)")
    return ref, ({"gguf_file": gguf_file} if gguf_file else {})


def publish(fresh: Path, folder: Path, complete: str) -> None:
    """Move the cache entry built in `fresh` to `folder` in one rename (readers see it whole or not at all).
    Two runs that build the same entry side by side both get here: the second finds the first's entry (its
    file `complete` present) and keeps it, leaving `fresh` to the caller to remove. A folder without
    `complete` is a copy left incomplete (by an older version, or a run killed mid-way): replaced."""
    if (folder / complete).exists():
        return
    if folder.exists():
        shutil.rmtree(folder, ignore_errors=True)
    try:
        os.replace(fresh, folder)
    except OSError:   # ENOTEMPTY / EEXIST: another run published the same entry since the check above
        if not (folder / complete).exists():
            raise


def _gguf_cache(folder: str, gguf_file: str) -> Path:
    """Where the de-quantized copy of a GGUF file is kept: converting takes ~20 s, loading the copy ~1 s."""
    path = Path(folder) / gguf_file
    stat = path.stat() if path.exists() else None
    key = f"{path.resolve()}:{stat.st_size if stat else ''}:{stat.st_mtime_ns if stat else ''}"
    return CACHE_DIR / "gguf" / f"{path.stem}-{hashlib.sha1(key.encode()).hexdigest()[:12]}"


def load_model(ref: str | os.PathLike, *, gguf_file: str | None = None, auto_class=None, cache: bool = True,
               expected_missing: tuple[str, ...] = (), **kwargs):
    """Load a model the way transformers does. For GGUF files the de-quantized weights are kept as a
    plain checkpoint in the hf_posenc cache (unless cache=False), so the next load is fast and the
    model can `save_pretrained`. A checkpoint without a tensor for one of the model's weights is refused (transformers
    would start it from random values and only log it), but for keys ending in `expected_missing` (what the caller
    puts back itself)."""
    with _hub_hint(ref):
        model = _load_model(ref, gguf_file, auto_class, cache, expected_missing, **kwargs)
    _compat.write_legacy_rope_keys(model.config)   # saved again, transformers 4.x reads it as this model too
    return model


def _load_model(ref, gguf_file, auto_class, cache, expected_missing, **kwargs):
    name, extra = resolve(ref, gguf_file)
    if "gguf_file" in extra:
        cached = _gguf_cache(name, extra["gguf_file"])
        if cache and (cached / "config.json").exists():
            name, extra = str(cached), {}
        elif not cache:
            model = _from_gguf(_auto_class(name, extra, auto_class, kwargs.get("config")), name, extra, **kwargs)
            _compat.drop_gguf_quantization(model)
            return _apply_gguf_rope_scaling(model, _gguf_path(name, extra["gguf_file"]))
        else:
            # de-quantize once in float32 into the cache, then load from it as asked (dtype=, config=, ...)
            model = _from_gguf(_auto_class(name, extra, auto_class, None), name, extra)
            _compat.drop_gguf_quantization(model)
            _apply_gguf_rope_scaling(model, _gguf_path(name, extra["gguf_file"]))
            fresh = cached.with_name(f".{cached.name}.tmp{os.getpid()}")  # the cache appears whole or not at all
            try:
                model.save_pretrained(fresh)
                try:
                    load_tokenizer(ref, gguf_file=gguf_file).save_pretrained(fresh)
                except (OSError, ValueError):  # a file without a tokenizer transformers builds: the model still loads
                    pass
                publish(fresh, cached, "config.json")
            finally:
                shutil.rmtree(fresh, ignore_errors=True)
            del model
            name, extra = str(cached), {}
    cls = _auto_class(name, extra, auto_class, kwargs.get("config"))
    model, info = cls.from_pretrained(name, **extra, **kwargs, output_loading_info=True)
    missing = sorted(k for k in info.get("missing_keys") or [] if not k.endswith(tuple(expected_missing)))
    if missing:
        raise InvalidInputError(f"{weights_file(name)}: holds no tensor for {_some(missing)} of the "
                                f"{model.config.model_type} model its config describes (transformers would start "
                                f"them from random values): the weights belong to another model or were cut short. "
                                f"Save or download the checkpoint again")
    return model


def _some(keys: list[str]) -> str:
    """'N weight(s) (first three, and M more)': which, without a wall of names."""
    shown = ", ".join(keys[:3]) + (f" and {len(keys) - 3} more" if len(keys) > 3 else "")
    return f"{len(keys)} weight(s) ({shown})"


def weights_file(name: str) -> str:
    """The weights file(s) of the checkpoint `name` (a folder: its safetensors file or index; else `name`)."""
    if os.path.isdir(name):
        for file in ("model.safetensors", "model.safetensors.index.json"):
            if os.path.isfile(os.path.join(name, file)):
                return os.path.join(name, file)
    return str(name)


def _from_gguf(cls, name: str, extra: dict, **kwargs):
    """`cls.from_pretrained` of a GGUF file, refusing a file that lacks weights of the model its header
    describes (transformers would fill them with random values and only print a report)."""
    model, info = cls.from_pretrained(name, **extra, **kwargs, output_loading_info=True)
    missing = sorted(info.get("missing_keys") or [])
    if missing:
        raise InvalidInputError(f"{os.path.join(name, extra['gguf_file'])}: the GGUF file holds no tensor for "
                                f"{_some(missing)} of the model its header describes: not a whole model")
    return model


def _gguf_path(name: str, gguf_file: str) -> Path:
    """The GGUF file on disk: in the local folder `name`, else where transformers keeps the hub repo
    `name`'s copy (already fetched by the config or model it loaded)."""
    local = Path(name) / gguf_file
    if local.is_file():
        return local
    from transformers.utils import cached_file

    return Path(cached_file(name, gguf_file))


def _apply_gguf_rope_scaling(model, path: Path):
    """Patch a model loaded from a GGUF file with the rope scaling its metadata holds (transformers drops
    it): the config goes back to the original context, then the scaling is planned and applied as hp.patch
    does on a fresh model (the model is not patched yet, and not in training)."""
    found = serving.gguf_patch(path)
    if found is None:
        return model
    method, params = found
    model.config.get_text_config().max_position_embeddings = params.pop("original_max_position_embeddings")
    registry.plan_patch(model, registry.get_method(method).from_dict(params)).apply()
    return model


def load_config(ref: str | os.PathLike, *, gguf_file: str | None = None):
    """The model's config. From a GGUF file (not yet in the cache) only the file's header is read. A file
    whose config transformers refuses (a corrupt header, metadata its validators reject: 32 heads over a
    16-wide embedding) is an `InvalidInputError` naming the file and the fault."""
    with _hub_hint(ref):
        name, extra = resolve(ref, gguf_file)
        if "gguf_file" in extra and (_gguf_cache(name, extra["gguf_file"]) / "config.json").exists():
            name, extra = str(_gguf_cache(name, extra["gguf_file"])), {}
        if "gguf_file" in extra:
            try:
                with gguf_header.config_only():  # seconds -> a fraction of one: no tokenizer strings parsed
                    return transformers.AutoConfig.from_pretrained(name, **extra)
            except PosEncError:
                raise
            except OSError as err:
                if not isinstance(err.__context__, UnicodeDecodeError):
                    raise
                # transformers reports a string of the header that is not UTF-8 as "not a valid JSON file"
                raise InvalidInputError(f"{_gguf_path(name, extra['gguf_file'])}: a string of its GGUF header is not "
                                        f"UTF-8 ({err.__context__.reason} at byte {err.__context__.start} of it): a "
                                        f"corrupt file") from None
            except Exception as err:
                # transformers' own metadata reader fails on a corrupt file with a bare struct.error: name the fault
                path = _gguf_path(name, extra["gguf_file"])
                gguf_header.read(path)
                raise _unreadable(path, "its metadata does not make a model config transformers accepts", err)
        try:
            return transformers.AutoConfig.from_pretrained(name, **extra)
        except (PosEncError, OSError):
            raise
        except Exception as err:
            where = os.path.join(name, "config.json") if os.path.isdir(name) else name
            raise _unreadable(where, "transformers refuses the config it holds", err)


def _unreadable(path, what: str, err: Exception) -> InvalidInputError:
    """A user's file that transformers cannot read, as a refusal: the file, what is wrong, the cause in one line."""
    cause = err.__cause__ if err.__cause__ is not None and "validation" in type(err).__name__.lower() else err
    detail = " ".join(f"{type(cause).__name__}: {cause}".split())
    found = InvalidInputError(f"{path}: {what} ({detail})")
    found.__cause__ = err
    return found


def damaged_safetensors(name: str) -> list[str]:
    """The safetensors files of a local folder that safetensors cannot open (truncated, overwritten)."""
    from safetensors import safe_open

    damaged = []
    if os.path.isdir(name):
        for file in sorted(os.listdir(name)):
            if file.endswith(".safetensors"):
                try:
                    with safe_open(os.path.join(name, file), framework="pt") as f:
                        f.keys()
                except Exception as err:  # noqa: BLE001  (the point is to name every file that fails)
                    damaged.append(f"{os.path.join(name, file)} ({err})")
    return damaged


def weights_problem(name: str, skeleton) -> str | None:
    """What is wrong with a local folder's weights for the model its config describes (`skeleton`, that model on the
    meta device), read from the safetensors headers alone (no tensor loads): none saved, a file safetensors cannot
    open, another model's tensors (under half of the skeleton's weight names among them), or tensors saved at other
    shapes. None where nothing is, or where the headers cannot tell (a hub id, .bin files, a quantized checkpoint).
    What only the load can tell (one weight of many absent) `load_model` refuses."""
    from safetensors import safe_open

    folder = Path(name)
    if not folder.is_dir():
        return None
    files = sorted(folder.glob("*.safetensors"))
    if not files and not any(folder.glob("*.bin")):
        return f"{name} holds a config but no weights (*.safetensors or *.bin)"
    damaged = damaged_safetensors(name)
    if damaged:
        return (f"{'; '.join(damaged)}: not a complete safetensors file (a copy or download cut short, a full disk); "
                f"save or download the checkpoint again")
    if not files or getattr(skeleton.config, "quantization_config", None):
        return None
    saved = {}
    for file in files:
        with safe_open(file, framework="pt") as f:
            saved.update((key, tuple(f.get_slice(key).get_shape())) for key in f.keys())
    expected = {key: tuple(p.shape) for key, p in skeleton.named_parameters()}   # a tied weight once
    # a name transformers maps on load (a prefix added or dropped) still counts as found
    found = {k for k in expected if k in saved or any(s.endswith("." + k) or k.endswith("." + s) for s in saved)}
    where = weights_file(name)
    if len(found) * 2 < len(expected):
        absent = [k for k in expected if k not in found]
        return (f"{where}: holds no tensor for {_some(absent)} of the {skeleton.config.model_type} model its config "
                f"describes ({len(found)} of {len(expected)} found; it holds {_some(sorted(saved))}): the weights of "
                f"another model. Save or download the checkpoint again, or load the config and weights that belong "
                f"together")
    shapes = [f"{k}: saved {saved[k]}, the config gives {shape}" for k, shape in expected.items()
              if k in saved and saved[k] != shape]
    if shapes:
        return (f"{where}: its tensors do not have the shapes its config gives ({'; '.join(shapes[:3])}"
                f"{' ...' if len(shapes) > 3 else ''}); the config or the weights were edited after saving (or come "
                f"from different models). Load the config and weights that belong together")
    return None


def meta_model(ref: str | os.PathLike, *, gguf_file: str | None = None):
    """The model's skeleton on the meta device: its modules and config, no weights (instant), in eval
    mode as from_pretrained gives it, patched as `load_model` patches it (a GGUF file's rope scaling)."""
    import torch

    config = load_config(ref, gguf_file=gguf_file)
    name, extra = resolve(ref, gguf_file)
    try:  # a config transformers accepted may still describe no model it can build (or rope keys it cannot read)
        cls = _auto_class("", {}, None, config)
        with torch.device("meta"):
            model = cls.from_config(config) if hasattr(cls, "from_config") else cls._from_config(config)
        if "gguf_file" in extra and not (_gguf_cache(name, extra["gguf_file"]) / "config.json").exists():
            _apply_gguf_rope_scaling(model, _gguf_path(name, extra["gguf_file"]))  # the cached copy is saved patched
    except (PosEncError, OSError):
        raise
    except Exception as err:
        where = os.path.join(name, extra["gguf_file"]) if "gguf_file" in extra else name
        from .record_reader import read_record

        record = read_record(config, os.path.join(where, "config.json"))
        if record is not None:   # a patch stock transformers cannot express (DCA, dynamic, ...): hf_posenc can
            raise InvalidInputError(
                f"{where} carries hf_posenc's `{record.method}` patch, which stock transformers cannot build: "
                f"hf_posenc.from_pretrained({str(ref)!r}) loads it. What loads stock checkpoints (the recipes) starts "
                f"from the model it was patched from, with the patch given as its posenc") from None
        raise _unreadable(where, "transformers cannot build the model its config describes", err)
    return model.eval()


def load_tokenizer(ref: str | os.PathLike, *, gguf_file: str | None = None):
    """The tokenizer saved with a model: a hub id, a folder, a .gguf file, or `smollm2` / `minilm` (the embedded
    models), as `load_model` takes them (a GGUF file's tokenizer comes from its cached copy once loaded)."""
    with _hub_hint(ref):
        name, extra = resolve(ref, gguf_file, model=False)
        if "gguf_file" in extra:
            cached = _gguf_cache(name, extra["gguf_file"])
            if (cached / "tokenizer_config.json").exists():
                return transformers.AutoTokenizer.from_pretrained(str(cached))
        if extra or not os.path.isdir(name):
            return transformers.AutoTokenizer.from_pretrained(name, **extra)
        try:
            return transformers.AutoTokenizer.from_pretrained(name)
        except PosEncError:
            raise
        except Exception as err:
            raise _tokenizer_refusal(name, err) from err


def _tokenizer_refusal(folder: str, err: Exception) -> InvalidInputError:
    """Why transformers builds no tokenizer from the folder `folder`, naming the file: a JSON file of it that does not
    parse (a tokenizer.json cut short: transformers gives a position, not the file), or no tokenizer.json (transformers
    then advises installing sentencepiece or tiktoken, to build one from a slow tokenizer's files that are not there)."""
    for file in sorted(f for f in os.listdir(folder) if f.endswith(".json")):
        path = os.path.join(folder, file)
        try:
            with open(path, encoding="utf-8") as handle:
                json.load(handle)
        except OSError:   # not readable: the cause below says what transformers met
            continue
        except ValueError as bad:   # JSONDecodeError, UnicodeDecodeError
            return InvalidInputError(f"{path} is not valid JSON ({' '.join(str(bad).split())}): cut short or "
                                     f"damaged; save the tokenizer again (tokenizer.save_pretrained)")
    if not os.path.isfile(os.path.join(folder, "tokenizer.json")):
        return InvalidInputError(f"{folder} has no tokenizer.json, and transformers builds no tokenizer from the "
                                 f"other files it holds; save the model's tokenizer into the folder "
                                 f"(tokenizer.save_pretrained)")
    return _unreadable(os.path.join(folder, "tokenizer.json"), "transformers builds no tokenizer from it", err)


def _auto_class(name: str, extra: dict, auto_class, config):
    """The architecture class the checkpoint names (so an encoder stays an encoder), else a causal LM."""
    if auto_class is not None:
        return auto_class
    config = config or transformers.AutoConfig.from_pretrained(name, **extra)
    for arch in getattr(config, "architectures", None) or []:
        cls = getattr(transformers, arch, None)
        if cls is not None:
            return cls
    return transformers.AutoModelForCausalLM


DTYPES = ("auto", "float32", "bfloat16", "float16")


def resolve_dtype(name: str, device=None):
    """(torch dtype, why) for a dtype name; "auto": bfloat16 where `device` runs it natively (a GPU that
    supports it, a CPU with AVX512-BF16 or AMX), float32 elsewhere."""
    import torch

    from .errors import InvalidParameterError

    if name == "auto":
        native, why = _compat.native_bfloat16(device)
        return (torch.bfloat16 if native else torch.float32), f"auto: {why}"
    if name not in DTYPES:
        raise InvalidParameterError(f"dtype must be one of {', '.join(DTYPES)}, got {name!r}")
    return getattr(torch, name), "asked for"
