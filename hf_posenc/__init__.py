"""hf_posenc: swap or rescale the positional mechanism of a pretrained Hugging Face model.

    import hf_posenc as hp
    hp.patch(model, "yarn", max_position_embeddings=32768)
    hp.describe(model)

The public names load on first use (PEP 562): `import hf_posenc` costs no torch or transformers import, so
`hf-posenc --help` and the recipes' `--help` answer at once. The errors are plain Python and load here.
"""

from __future__ import annotations

import importlib

from .errors import (
    AlreadyPatchedError,
    CheckpointMismatchError,
    CheckpointRecordError,
    InvalidInputError,
    InvalidParameterError,
    MethodNotApplicableError,
    ModelNotFoundError,
    NotPatchedError,
    ParameterTypeError,
    PosEncError,
    SequenceTooLongError,
    UnknownMethodError,
    UnsupportedModelError,
)

__version__ = "0.1.0"

__all__ = [
    "patch", "unpatch", "patched", "describe", "from_pretrained", "list_methods", "load_model", "load_tokenizer", "configs",
    "serving_overrides", "llama_cpp_args", "write_gguf", "write_gguf_model",
    "check_length", "CheckpointMismatchError", "CheckpointRecordError", "InvalidInputError", "ModelNotFoundError",
    "PosEncError", "UnknownMethodError", "UnsupportedModelError", "MethodNotApplicableError",
    "InvalidParameterError", "ParameterTypeError", "AlreadyPatchedError", "NotPatchedError", "SequenceTooLongError",
]

# public name -> the module that defines it (None: the name is the submodule itself)
_LAZY = {
    "patch": ".api", "unpatch": ".api", "patched": ".api", "describe": ".api", "from_pretrained": ".api",
    "list_methods": ".registry", "load_model": ".api", "load_tokenizer": ".loading", "configs": None,
    "serving_overrides": ".export.serving", "llama_cpp_args": ".export.serving", "write_gguf": ".export.serving",
    "write_gguf_model": ".export.gguf_writer", "check_length": ".families.learned_tables",
}


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    importlib.import_module(".registry", __name__)   # every method registered, its rope_type known to transformers
    where = _LAZY[name]
    value = importlib.import_module(f".{name}" if where is None else where, __name__)
    if where is not None:
        value = getattr(value, name)
    globals()[name] = value   # later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    """The public face for tab completion: `__all__` (submodules stay importable: `import hf_posenc.eval`)."""
    return sorted([*__all__, "__version__"])
