"""Moved to hf_posenc/export/gguf_writer.py: this name keeps `hf_posenc.gguf_writer` imports working (the same
module object, not a copy)."""

import sys

from .export import gguf_writer as _moved

sys.modules[__name__] = _moved
