"""OPT: `decoder.embed_positions`, offset 2 (padding reads position -1, row 1); positions count the
attended tokens of the attention mask."""

from .learned_tables import TableSpec, register_learned_families

OPT = TableSpec(name="opt", model_types=("opt",), tables=("decoder.embed_positions",), call="mask")

register_learned_families(OPT)
