"""Family adapters: each knows where one architecture family keeps its positions.
Importing this package registers them."""

from . import rope_models  # noqa: F401
