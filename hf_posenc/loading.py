"""Load a model from a hub id, a local folder or a GGUF file, ready to patch and save."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import transformers

from . import _compat, assets, gguf_header
from .errors import ModelNotFoundError, ParameterTypeError

CACHE_DIR = Path(os.environ.get("HF_POSENC_CACHE", Path.home() / ".cache" / "hf_posenc"))


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
    try:  # a name, not a Path object, may be an embedded model's
        ref = assets.resolve_alias(ref) if isinstance(ref, str) else str(ref)
    except FileNotFoundError as err:  # the alias's asset package is not installed: say how to install it
        raise ModelNotFoundError(f"{ref!r} names an embedded model, but {err}") from None
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


def _gguf_cache(folder: str, gguf_file: str) -> Path:
    """Where the de-quantized copy of a GGUF file is kept: converting takes ~20 s, loading the copy ~1 s."""
    path = Path(folder) / gguf_file
    stat = path.stat() if path.exists() else None
    key = f"{path.resolve()}:{stat.st_size if stat else ''}:{stat.st_mtime_ns if stat else ''}"
    return CACHE_DIR / "gguf" / f"{path.stem}-{hashlib.sha1(key.encode()).hexdigest()[:12]}"


def load_model(ref: str | os.PathLike, *, gguf_file: str | None = None, auto_class=None, cache: bool = True,
               **kwargs):
    """Load a model the way transformers does. For GGUF files the de-quantized weights are kept as a
    plain checkpoint in the hf_posenc cache (unless cache=False), so the next load is fast and the
    model can `save_pretrained`."""
    name, extra = resolve(ref, gguf_file)
    if "gguf_file" in extra:
        cached = _gguf_cache(name, extra["gguf_file"])
        if cache and (cached / "config.json").exists():
            name, extra = str(cached), {}
        elif not cache:
            model = _auto_class(name, extra, auto_class, kwargs.get("config")).from_pretrained(name, **extra, **kwargs)
            _compat.drop_gguf_quantization(model)
            return _apply_gguf_rope_scaling(model, _gguf_path(name, extra["gguf_file"]))
        else:
            # de-quantize once in float32 into the cache, then load from it as asked (dtype=, config=, ...)
            model = _auto_class(name, extra, auto_class, None).from_pretrained(name, **extra)
            _compat.drop_gguf_quantization(model)
            _apply_gguf_rope_scaling(model, _gguf_path(name, extra["gguf_file"]))
            model.save_pretrained(cached)
            load_tokenizer(ref, gguf_file=gguf_file).save_pretrained(cached)
            del model
            name, extra = str(cached), {}
    return _auto_class(name, extra, auto_class, kwargs.get("config")).from_pretrained(name, **extra, **kwargs)


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
    it): the config goes back to the original context, then the scaling is applied as hp.patch does."""
    from . import api, serving

    found = serving.gguf_patch(path)
    if found is None:
        return model
    method, params = found
    model.config.get_text_config().max_position_embeddings = params.pop("original_max_position_embeddings")
    return api.patch(model, method, **params)


def load_config(ref: str | os.PathLike, *, gguf_file: str | None = None):
    """The model's config. From a GGUF file (not yet in the cache) only the file's header is read."""
    name, extra = resolve(ref, gguf_file)
    if "gguf_file" in extra and (_gguf_cache(name, extra["gguf_file"]) / "config.json").exists():
        name, extra = str(_gguf_cache(name, extra["gguf_file"])), {}
    if "gguf_file" in extra:
        try:
            with gguf_header.config_only():  # seconds -> a fraction of one: no tokenizer strings parsed
                return transformers.AutoConfig.from_pretrained(name, **extra)
        except Exception:
            # transformers' own metadata reader fails on a corrupt file with a bare struct.error: name the fault
            gguf_header.read(_gguf_path(name, extra["gguf_file"]))
            raise
    return transformers.AutoConfig.from_pretrained(name, **extra)


def meta_model(ref: str | os.PathLike, *, gguf_file: str | None = None):
    """The model's skeleton on the meta device: its modules and config, no weights (instant), in eval
    mode as from_pretrained gives it, patched as `load_model` patches it (a GGUF file's rope scaling)."""
    import torch

    config = load_config(ref, gguf_file=gguf_file)
    cls = _auto_class("", {}, None, config)
    with torch.device("meta"):
        model = cls.from_config(config) if hasattr(cls, "from_config") else cls._from_config(config)
    name, extra = resolve(ref, gguf_file)
    if "gguf_file" in extra and not (_gguf_cache(name, extra["gguf_file"]) / "config.json").exists():
        _apply_gguf_rope_scaling(model, _gguf_path(name, extra["gguf_file"]))  # the cached copy is saved patched
    return model.eval()


def load_tokenizer(ref: str | os.PathLike, *, gguf_file: str | None = None):
    name, extra = resolve(ref, gguf_file, model=False)
    if "gguf_file" in extra:
        cached = _gguf_cache(name, extra["gguf_file"])
        if (cached / "tokenizer_config.json").exists():
            return transformers.AutoTokenizer.from_pretrained(str(cached))
    return transformers.AutoTokenizer.from_pretrained(name, **extra)


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
