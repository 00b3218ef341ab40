"""Family adapters: each knows where one architecture family keeps its positions.
Importing this package registers them."""

from . import rope_models  # noqa: F401
from . import bart, bert, biogpt, distilbert, gpt2, gpt_neo, opt  # noqa: F401,E402  (learned position tables)
