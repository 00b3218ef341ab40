"""Deprecated name of hf_posenc.recipes.recipe_config, the recipes' config system (renamed so that a module
called `config` is hf_posenc.config alone, the methods' parameters). This name goes in the next release."""

import sys
import warnings

from . import recipe_config

warnings.warn("hf_posenc.recipes.config is now hf_posenc.recipes.recipe_config; the old name goes in the next "
              "release", DeprecationWarning, stacklevel=2)
sys.modules[__name__] = recipe_config   # one module under both names: a monkeypatch on either holds for both
