"""The one GGUF header reader: what it reads equals what the gguf package wrote (and what its own
reader reads back), arrays are skipped when not wanted, and a file that is not GGUF is refused."""

from __future__ import annotations

import gguf
import numpy as np
import pytest

from splitserve.gguf_header import GGUFFormatError, open_gguf, read_header, read_metadata

METADATA = {
    "test.u32": 7, "test.i64": -3, "test.f32": 0.5, "test.flag": True, "test.name": "héllo 東京",
    "test.ints": [1, -2, 3], "test.floats": [0.25, -1.5], "test.flags": [True, False, True],
    "test.words": ["a", "", "ünï"],
}  # fmt: skip


def _write(path: str) -> dict[str, np.ndarray]:
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_uint32("test.u32", 7)
    writer.add_int64("test.i64", -3)
    writer.add_float32("test.f32", 0.5)
    writer.add_bool("test.flag", True)
    writer.add_string("test.name", "héllo 東京")
    writer.add_array("test.ints", [1, -2, 3])
    writer.add_array("test.floats", [0.25, -1.5])
    writer.add_array("test.flags", [True, False, True])
    writer.add_array("test.words", ["a", "", "ünï"])
    tensors = {
        "a.weight": np.arange(6, dtype=np.float32).reshape(2, 3),
        "b.weight": np.full((4,), 2.0, dtype=np.float16),
    }
    for name, value in tensors.items():
        writer.add_tensor(name, value)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return tensors


def test_header_reads_back_what_was_written(tmp_path):
    path = str(tmp_path / "t.gguf")
    tensors = _write(path)
    buf, header = open_gguf(path)
    assert header.version == 3
    assert {k: header.metadata[k] for k in METADATA} == METADATA
    assert header.metadata["general.architecture"] == "llama"
    infos = {t.name: t for t in header.tensors}
    assert set(infos) == set(tensors)
    theirs = {t.name: t for t in gguf.GGUFReader(path).tensors}
    for name, value in tensors.items():
        info = infos[name]
        assert info.shape == value.shape
        assert info.ggml_type == theirs[name].tensor_type
        start = header.data_start + info.offset
        assert start == theirs[name].data_offset
        got = np.frombuffer(buf[start : start + value.nbytes], value.dtype).reshape(value.shape)
        np.testing.assert_array_equal(got, value)


def test_arrays_are_skipped_unless_wanted(tmp_path):
    path = str(tmp_path / "t.gguf")
    _write(path)
    skipped = read_header(np.memmap(path, dtype=np.uint8, mode="r"), arrays=False)
    assert all(skipped.metadata[k] is None for k in METADATA if isinstance(METADATA[k], list))
    assert skipped.metadata["test.name"] == METADATA["test.name"]
    assert skipped.tensors == open_gguf(path)[1].tensors  # the table after them is still found


def test_not_gguf_or_truncated_is_refused(tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"NOPE" + bytes(20))
    with pytest.raises(GGUFFormatError, match="not a GGUF file"):
        read_metadata(str(bad))
    path = tmp_path / "t.gguf"
    _write(str(path))
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(path.read_bytes()[:60])
    with pytest.raises(GGUFFormatError, match="truncated"):
        read_metadata(str(cut))
