"""The header-only GGUF reader (hf_posenc.gguf_header) against the gguf library's full reader: the same keys,
values and tensor names on written files of either byte order and on the embedded SmolLM2 file, the same
config through transformers, and a clear error for files it cannot walk."""

from __future__ import annotations

import numpy as np
import pytest
import transformers

from hf_posenc import gguf_header, loading

gguf = pytest.importorskip("gguf")


def write(path, endianess=None):
    """A llama-architecture file with a value of every scalar type and arrays of numbers and strings."""
    kwargs = {} if endianess is None else {"endianess": endianess}
    writer = gguf.GGUFWriter(path, arch="llama", **kwargs)
    writer.add_context_length(64)
    writer.add_block_count(2)
    writer.add_embedding_length(16)
    writer.add_feed_forward_length(32)
    writer.add_head_count(2)
    writer.add_head_count_kv(1)
    writer.add_rope_freq_base(5e5)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_string("general.name", "tiny")
    writer.add_bool("general.flag", True)
    for name, kind in [("u8", "uint8"), ("i8", "int8"), ("u16", "uint16"), ("i16", "int16"), ("u32", "uint32"),
                       ("i32", "int32"), ("u64", "uint64"), ("i64", "int64")]:
        getattr(writer, f"add_{kind}")(f"test.{name}", 7)
    writer.add_float64("test.f64", 0.25)
    writer.add_array("tokenizer.ggml.tokens", [f"t{i}" for i in range(300)] + ["é", ""])
    writer.add_array("tokenizer.ggml.token_type", [1] * 302)
    writer.add_array("test.floats", [0.5, 1.5, -2.0])
    writer.add_tensor("token_embd.weight", np.arange(64, dtype=np.float32).reshape(4, 16))
    writer.add_tensor("blk.0.attn_q.weight", np.ones((2, 3, 4), dtype=np.float16))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def assert_same_as_gguf(path):
    full, header = gguf.GGUFReader(path), gguf_header.read(path)
    keys = [k for k in full.fields if not k.startswith("GGUF.")]  # gguf's own entries for the header fields
    assert list(header.values) == keys
    for key in keys:
        field, ours = full.fields[key], header.values[key]
        assert header.types[key] == [int(t) for t in field.types], key
        if isinstance(ours, gguf_header.StringArray):
            assert ours.count == len(field.data), key
        elif isinstance(ours, np.ndarray):
            assert ours.tolist() == field.contents(), key
        else:
            assert ours == field.contents(), key
    assert header.tensor_names == tuple(t.name for t in full.tensors)


@pytest.mark.parametrize("order", ["little", "big"])
def test_written_files_read_as_the_gguf_library_reads_them(tmp_path, order):
    endianess = gguf.GGUFEndian.BIG if order == "big" else None
    assert_same_as_gguf(write(tmp_path / "t.gguf", endianess))


def test_the_config_is_the_one_transformers_reads(tmp_path):
    path = write(tmp_path / "t.gguf")
    expected = transformers.AutoConfig.from_pretrained(tmp_path, gguf_file="t.gguf").to_dict()
    with gguf_header.config_only():
        ours = transformers.AutoConfig.from_pretrained(tmp_path, gguf_file="t.gguf").to_dict()
    assert ours == expected and ours["vocab_size"] == 302  # no vocab_size key: the token count
    assert loading.load_config(path).to_dict() == expected


def test_files_it_cannot_walk_are_named_and_go_to_the_full_reader(tmp_path):
    good = write(tmp_path / "t.gguf").read_bytes()
    cases = {"empty.gguf": b"", "text.gguf": b"not a gguf file at all", "cut.gguf": good[:200],
             "v1.gguf": good[:4] + (1).to_bytes(4, "little") + good[8:]}
    messages = {"empty.gguf": "empty file", "text.gguf": "not a GGUF file", "cut.gguf": "ends early",
                "v1.gguf": "version 1"}
    for name, data in cases.items():
        (tmp_path / name).write_bytes(data)
        with pytest.raises(gguf_header.GGUFHeaderError, match=messages[name]):
            gguf_header.read(tmp_path / name)
    seen = []
    original = gguf.GGUFReader
    with gguf_header.config_only():
        assert gguf.GGUFReader is not original
        for name in cases:
            try:  # the full reader's own error (or result) for what the header reader refused
                gguf.GGUFReader(tmp_path / name)
            except Exception as err:  # noqa: BLE001 - whichever error gguf raises
                seen.append(type(err).__name__)
    assert gguf.GGUFReader is original and len(seen) == len(cases)


@pytest.mark.real
def test_the_embedded_smollm2_file():
    from hf_posenc import assets

    path = assets.smollm2_gguf()
    assert_same_as_gguf(path)
    expected = transformers.AutoConfig.from_pretrained(path.parent, gguf_file=path.name).to_dict()
    with gguf_header.config_only():
        assert transformers.AutoConfig.from_pretrained(path.parent, gguf_file=path.name).to_dict() == expected
