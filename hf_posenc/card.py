"""Moved: the card of a patched folder to hf_posenc/export/card.py, a fine-tune's to
hf_posenc/recipes/finetune_card.py. This name keeps `hf_posenc.card` imports working."""

from .export.card import STOCK_METHODS, fit_tokenizer, patch_card  # noqa: F401
from .recipes.finetune_card import objective_teacher, positions_line, write_model_card  # noqa: F401
