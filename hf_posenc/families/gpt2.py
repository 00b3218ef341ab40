"""GPT-2 and GPT-BigCode: a learned table `wpe` indexed by the position ids, no rows below position 0."""

from .learned_tables import TableSpec, register_learned_families

GPT2 = TableSpec(name="gpt2", model_types=("gpt2", "gpt_bigcode"), tables=("wpe",))

register_learned_families(GPT2)
