"""hf_posenc: swap or rescale the positional mechanism of a pretrained Hugging Face model.

    import hf_posenc as hp
    hp.patch(model, "yarn", max_position_embeddings=32768)
    hp.describe(model)
"""

from . import configs
from .api import describe, from_pretrained, patch, patched, unpatch
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
from .families.learned_tables import check_length
from .loading import load_model, load_tokenizer
from .registry import list_methods
from .serving import llama_cpp_args, serving_overrides, write_gguf

from . import _compat as _compat_
from .methods.rope import CUSTOM_ROPE_TYPE_PREFIX as _PREFIX
from .registry import METHODS as _METHODS

# transformers warns "Missing validation function" at every config load / save for a rope_type it does not
# know: hf_posenc's own markers get a validator (an attention method or a dynamic one records one)
_compat_.register_custom_rope_types(_PREFIX + name for name in _METHODS)

__version__ = "0.1.0"

__all__ = [
    "patch", "unpatch", "patched", "describe", "from_pretrained", "list_methods", "load_model", "load_tokenizer", "configs",
    "serving_overrides", "llama_cpp_args", "write_gguf",
    "check_length", "CheckpointMismatchError", "CheckpointRecordError", "InvalidInputError", "ModelNotFoundError",
    "PosEncError", "UnknownMethodError", "UnsupportedModelError", "MethodNotApplicableError",
    "InvalidParameterError", "ParameterTypeError", "AlreadyPatchedError", "NotPatchedError", "SequenceTooLongError",
]


def __dir__() -> list[str]:
    """The public face for tab completion: `__all__` (submodules stay importable: `import hf_posenc.eval`)."""
    return sorted([*__all__, "__version__"])
