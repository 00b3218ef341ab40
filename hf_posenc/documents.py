"""Moved to hf_posenc/train/documents.py: this name keeps `hf_posenc.documents` imports working (the same
module object, not a copy)."""

import sys

from .train import documents as _moved

sys.modules[__name__] = _moved
