"""``read_gguf``: the same fields and tensors as ``gguf.GGUFReader``, parsed once per file."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")

from graphrt.checkpoints.gguf_file import read_gguf  # noqa: E402


def write(path: Path, tokens: list[str]) -> Path:
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_token_list(tokens)
    writer.add_token_types([1] * (len(tokens) - 1) + [3])
    writer.add_token_merges(["a b", "ab c"])
    writer.add_eos_token_id(2)
    writer.add_chat_template("{{ messages }}")
    writer.add_tensor("w", np.arange(64, dtype=np.float32).reshape(2, 32))
    q = gguf.quants.quantize(
        np.linspace(-1, 1, 64, dtype=np.float32).reshape(2, 32), gguf.GGMLQuantizationType.Q8_0
    )
    writer.add_tensor("q", q, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_same_fields_and_tensors_as_gguf_reader(tmp_path: Path) -> None:
    path = write(tmp_path / "m.gguf", ["<s>", "a", "b", "ab", "é", "</s>"])
    fast, ref = read_gguf(path), gguf.GGUFReader(str(path))
    assert list(fast.fields) == list(ref.fields)
    for key, field in ref.fields.items():
        assert fast.fields[key].contents() == field.contents(), key
    assert [t.name for t in fast.tensors] == [t.name for t in ref.tensors]
    for mine, theirs in zip(fast.tensors, ref.tensors, strict=True):
        assert mine.tensor_type == theirs.tensor_type and list(mine.shape) == list(theirs.shape)
        np.testing.assert_array_equal(mine.data, theirs.data)


def test_parsed_once_until_the_file_changes(tmp_path: Path) -> None:
    path = write(tmp_path / "m.gguf", ["<s>", "a", "</s>"])
    first = read_gguf(path)
    assert read_gguf(str(path)) is first
    write(path, ["<s>", "b", "c", "</s>"])
    os.utime(path, ns=(1, 1))  # NOTE: a new mtime even where the clock is coarse
    assert read_gguf(path).fields["tokenizer.ggml.tokens"].contents() == ["<s>", "b", "c", "</s>"]
