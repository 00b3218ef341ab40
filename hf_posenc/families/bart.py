"""BART and its kin: one table in the encoder and one in the decoder, offset 2, positions counted
from the cache length. Both are patched with the same method; a decoder-only head (BartForCausalLM)
has only the decoder's."""

from .learned_tables import TableSpec, register_learned_families

BART = TableSpec(
    name="bart", model_types=("bart", "mbart", "plbart"),
    tables=("encoder.embed_positions", "decoder.embed_positions"), call="arange",
)

register_learned_families(BART)
