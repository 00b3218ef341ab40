"""BERT-style encoders: `embeddings.position_embeddings`, with the `position_ids` and `token_type_ids`
buffers sized by the context (they grow with the table). RoBERTa and its kin put position 0 at row
padding_idx + 1 (padding reads row padding_idx) and count those rows in max_position_embeddings."""

from .learned_tables import GrowingBuffer, TableSpec, arange_buffer, register_learned_families, zeros_buffer

EMBEDDING_BUFFERS = (
    GrowingBuffer("embeddings", "position_ids", arange_buffer),
    GrowingBuffer("embeddings", "token_type_ids", zeros_buffer),
)

BERT = TableSpec(
    name="bert", model_types=("bert", "electra", "ernie", "megatron-bert", "albert"),
    tables=("embeddings.position_embeddings",), buffers=EMBEDDING_BUFFERS, guard_at="embeddings",
)
ROBERTA = TableSpec(
    name="roberta",
    model_types=("roberta", "xlm-roberta", "camembert", "data2vec-text", "roberta-prelayernorm", "xmod"),
    tables=("embeddings.position_embeddings",), padding_offset=True, buffers=EMBEDDING_BUFFERS,
    guard_at="embeddings",
)

register_learned_families(BERT, ROBERTA)
