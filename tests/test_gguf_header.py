"""The header-only GGUF reader (hf_posenc.export.gguf_header) against the gguf library's full reader: the same keys,
values and tensor names on written files of either byte order and on the embedded SmolLM2 file, the same
config through transformers, and a clear error for files it cannot walk (random damage to a header included:
accepted, or refused in one line)."""

from __future__ import annotations

import struct
import threading

import numpy as np
import pytest
import transformers

import hf_posenc as hp
from hf_posenc.export import gguf_header
from hf_posenc import cli, loading
from refusals import cache, ggufs  # noqa: F401 (fixtures)

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


def test_arrays_of_arrays_are_walked_and_counted(tmp_path):
    """gguf writes nested arrays (transformers' own metadata reader refuses them, so no config test)."""
    writer = gguf.GGUFWriter(tmp_path / "n.gguf", arch="llama")
    writer.add_array("test.nested", [[1, 2], [3], [4, 5, 6]])
    writer.add_uint32("test.after", 9)
    writer.add_tensor("w", np.ones(4, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    header, full = gguf_header.read(tmp_path / "n.gguf"), gguf.GGUFReader(tmp_path / "n.gguf")
    assert header.values["test.nested"] == gguf_header.StringArray(3) and header.values["test.after"] == 9
    assert header.types["test.nested"] == [int(t) for t in full.fields["test.nested"].types]
    assert header.tensor_names == ("w",)


def test_the_config_is_the_one_transformers_reads_without_the_full_reader(tmp_path, monkeypatch):
    path = write(tmp_path / "t.gguf")
    expected = transformers.AutoConfig.from_pretrained(tmp_path, gguf_file="t.gguf").to_dict()

    def full_reader(*args, **kwargs):
        raise AssertionError("gguf's full reader was called for a file the header reader walks")

    monkeypatch.setattr(gguf, "GGUFReader", full_reader)
    assert loading.load_config(path).to_dict() == expected
    assert expected["vocab_size"] == 302  # no vocab_size key: the token count
    assert gguf.GGUFReader is full_reader  # restored


def write_scaled(path, name: str | None = None):
    """A llama GGUF with YaRN rope scaling (factor 4 from 64 to 256) in its metadata (and general.name)."""
    writer = gguf.GGUFWriter(path, arch="llama")
    if name is not None:
        writer.add_name(name)
    writer.add_context_length(256)
    writer.add_rope_scaling_type(gguf.RopeScalingType.YARN)
    writer.add_rope_scaling_factor(4.0)
    writer.add_rope_scaling_orig_ctx_len(64)
    for add, value in [("block_count", 2), ("embedding_length", 16), ("feed_forward_length", 32),
                       ("head_count", 2), ("head_count_kv", 1), ("rope_freq_base", 1e4), ("layer_norm_rms_eps", 1e-5)]:
        getattr(writer, f"add_{add}")(value)
    writer.add_array("tokenizer.ggml.tokens", [f"t{i}" for i in range(40)])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_a_header_string_that_is_not_utf8_is_named_not_called_json(tmp_path):
    """A corrupt byte in a header string: transformers said "the config file ... is not a valid JSON file"."""
    good = write_scaled(tmp_path / "s.gguf", name="tiny-model").read_bytes()
    bad = good.replace(b"tiny-model", b"tiny\xc3(odel", 1)   # a UTF-8 lead byte, no continuation: same length
    assert bad != good
    (tmp_path / "bad.gguf").write_bytes(bad)
    with pytest.raises(hp.InvalidInputError, match=r"bad\.gguf: a string of its GGUF header is not UTF-8"):
        loading.load_config(tmp_path / "bad.gguf")


def test_a_scaled_file_gives_a_patched_skeleton(tmp_path):
    """transformers drops a GGUF file's rope scaling; the meta skeleton (what `hf-posenc inspect` shows)
    carries it, as load_model does."""
    path = write_scaled(tmp_path / "s.gguf")
    assert loading.load_config(path).max_position_embeddings == 256  # transformers' own reading
    info = hp.describe(loading.meta_model(path))
    assert (info["method"], info["factor"], info["max_position_embeddings"]) == ("yarn", 4.0, 256)


def test_a_hub_gguf_is_read_from_the_hub_cache(tmp_path, monkeypatch):
    """`org/repo` + gguf_file: the rope scaling is read from the copy transformers fetched, not from a
    local path `org/repo/s.gguf` (which does not exist)."""
    path = write_scaled(tmp_path / "s.gguf")
    fetched = []

    def hub(repo, filename, *args, **kwargs):
        fetched.append((repo, filename))
        return str(path) if (repo, filename) == ("org/scaled", "s.gguf") else None

    monkeypatch.setattr(transformers.configuration_utils, "cached_file", hub)
    monkeypatch.setattr(transformers.utils, "cached_file", hub)
    info = hp.describe(loading.meta_model("org/scaled", gguf_file="s.gguf"))
    assert (info["method"], info["factor"], info["max_position_embeddings"]) == ("yarn", 4.0, 256)
    assert set(fetched) == {("org/scaled", "s.gguf")}


def _walked_file(good: bytes, pairs: int, tensors: int, tail: bytes) -> bytes:
    """A v3 header with the given counts, followed by `tail` (key-value pairs and tensor entries)."""
    return good[:8] + struct.pack("<QQ", tensors, pairs) + tail


def _pair(key: str, kind: int, payload: bytes) -> bytes:
    return struct.pack("<Q", len(key)) + key.encode() + struct.pack("<I", kind) + payload


def test_files_it_cannot_walk_are_refused_by_name(tmp_path):
    good = write(tmp_path / "t.gguf").read_bytes()
    string_value = _pair("a", 8, struct.pack("<Q", 1) + b"x")
    cases = {
        "empty.gguf": (b"", "empty file"),
        "text.gguf": (b"not a gguf file at all", "not a GGUF file"),
        "cut.gguf": (good[:200], "ends early|do not fit"),
        "v1.gguf": (good[:4] + (1).to_bytes(4, "little") + good[8:], "version 1"),
        "pairs.gguf": (_walked_file(good, 2**62, 0, string_value), "key-value pairs .* do not fit"),
        "huge-array.gguf": (_walked_file(good, 1, 0, _pair("a", 9, struct.pack("<IQ", 10, 2**61))),
                            "array elements .* do not fit"),
        "huge-strings.gguf": (_walked_file(good, 1, 0, _pair("a", 9, struct.pack("<IQ", 8, 2**60))),
                              "array elements .* do not fit"),
        "tensors.gguf": (_walked_file(good, 1, 1, string_value + struct.pack("<Q", 1) + b"w"
                                      + struct.pack("<I", 1000) + bytes(40)), "ends early"),
        "twice.gguf": (_walked_file(good, 2, 0, string_value + string_value), "'a' appears twice"),
        "deep.gguf": (_walked_file(good, 1, 0, _pair("a", 9, struct.pack("<IQ", 9, 1) * 2000)), "nested more than 16"),
        "latin1.gguf": (_walked_file(good, 1, 0, _pair("\xe9", 4, struct.pack("<I", 1)).replace(
            "\xe9".encode(), b"\xe9")), "not UTF-8"),
    }
    for name, (data, message) in cases.items():
        (tmp_path / name).write_bytes(data)
        with pytest.raises(gguf_header.GGUFHeaderError, match=message):
            gguf_header.read(tmp_path / name)
    full = gguf.GGUFReader
    with gguf_header.config_only():  # what transformers constructs: the clear refusal, not gguf's error or hang
        assert not isinstance(gguf.GGUFReader(tmp_path / "t.gguf"), full)
        for name, (_, message) in cases.items():
            with pytest.raises(gguf_header.GGUFHeaderError, match=message):
                gguf.GGUFReader(tmp_path / name)
    assert gguf.GGUFReader is full


def test_other_threads_and_nested_windows_get_the_reader_they_expect(tmp_path):
    path, original = write(tmp_path / "t.gguf"), gguf.GGUFReader
    seen = {}
    with gguf_header.config_only():
        with gguf_header.config_only():  # nested in the same thread: no second swap
            seen["nested"] = gguf.GGUFReader(path)
        thread = threading.Thread(target=lambda: seen.setdefault("thread", gguf.GGUFReader(path)))
        thread.start()
        thread.join()
        seen["after nested"] = gguf.GGUFReader(path)
    assert not isinstance(seen["nested"], original) and not isinstance(seen["after nested"], original)
    assert isinstance(seen["thread"], original)  # another thread reads whole files, as it asked
    assert gguf.GGUFReader is original


@pytest.mark.real
def test_the_embedded_smollm2_file():
    from hf_posenc import assets

    path = assets.smollm2_gguf()
    assert_same_as_gguf(path)
    expected = transformers.AutoConfig.from_pretrained(path.parent, gguf_file=path.name).to_dict()
    with gguf_header.config_only():
        assert transformers.AutoConfig.from_pretrained(path.parent, gguf_file=path.name).to_dict() == expected


# -- random damage to a written file's header: accepted, or refused in one line --------------------------------------

def _mutations(good: bytes, count: int, seed: int = 0):
    """Seeded random damage to the header of a valid file: a byte changed, a run of bytes, a cut."""
    rng = np.random.default_rng(seed)
    header = good.index(b"token_embd.weight") + 64  # the key-value pairs and the start of the tensor table
    for i in range(count):
        data = bytearray(good)
        kind = i % 3
        at = int(rng.integers(4, header))
        if kind == 0:
            data[at] = int(rng.integers(0, 256))
        elif kind == 1:
            data[at:at + 4] = rng.integers(0, 256, 4, dtype=np.uint8).tobytes()
        else:
            data = data[:at]
        yield bytes(data)


def test_random_damage_to_a_gguf_header_is_accepted_or_refused_in_one_line(ggufs, cache, tmp_path, capsys):
    good = (ggufs / "good.gguf").read_bytes()
    outcomes = {"accepted": 0, "refused": 0}
    for i, data in enumerate(_mutations(good, 90)):
        path = tmp_path / f"m{i}.gguf"
        path.write_bytes(data)
        capsys.readouterr()
        try:
            cli.main(["inspect", str(path)])
            outcomes["accepted"] += 1
        except SystemExit as exit_:
            lines = capsys.readouterr().err.strip().splitlines()
            assert exit_.code == 2 and len(lines) == 1 and lines[0].startswith("error: "), (i, lines)
            outcomes["refused"] += 1
    assert outcomes["refused"] > 30, outcomes
