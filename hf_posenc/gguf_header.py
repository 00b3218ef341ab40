"""Moved to hf_posenc/export/gguf_header.py: this name keeps `hf_posenc.gguf_header` imports working (the same
module object, not a copy)."""

import sys

from .export import gguf_header as _moved

sys.modules[__name__] = _moved
