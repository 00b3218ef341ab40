"""DistilBERT: BERT's `embeddings.position_embeddings` with a `position_ids` buffer; with
`sinusoidal_pos_embds=True` its table is a fixed sinusoid (described as mechanism "sinusoidal"),
which the learned methods treat as a table like any other."""

from .learned_tables import GrowingBuffer, TableSpec, arange_buffer, register_learned_families

DISTILBERT = TableSpec(
    name="distilbert", model_types=("distilbert",), tables=("embeddings.position_embeddings",),
    buffers=(GrowingBuffer("embeddings", "position_ids", arange_buffer),), guard_at="embeddings",
    sinusoidal_flag="sinusoidal_pos_embds",
)

register_learned_families(DISTILBERT)
