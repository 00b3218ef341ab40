"""BioGPT: OPT's layout (offset 2, positions from the attention mask) at `embed_positions`."""

from .learned_tables import TableSpec, register_learned_families

BIOGPT = TableSpec(name="biogpt", model_types=("biogpt",), tables=("embed_positions",), call="mask")

register_learned_families(BIOGPT)
