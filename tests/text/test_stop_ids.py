"""Stop tokens of a reply: the tokenizer's EOS and the ids the checkpoint itself declares."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from graphrt.text.tokenizer import declared_stop_ids, stop_ids


def test_directory_declares_generation_config_and_config_eos(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"eos_token_id": 3}))
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [5, 7]}))
    assert declared_stop_ids(tmp_path) == {3, 5, 7}
    assert stop_ids(SimpleNamespace(eos_token_id=9), tmp_path) == {3, 5, 7, 9}
    assert stop_ids(SimpleNamespace(eos_token_id=None)) == set()


def test_gguf_declares_its_end_of_generation_ids(tmp_path: Path) -> None:
    gguf = pytest.importorskip("gguf")
    path = tmp_path / "meta.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_eos_token_id(2)
    writer.add_eot_token_id(7)
    writer.add_bos_token_id(1)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    assert declared_stop_ids(path) == {2, 7}
    # NOTE: a tokenizer whose EOS is another id (transformers 5.17 on SmolLM2) still stops at 2
    assert stop_ids(SimpleNamespace(eos_token_id=1), path) == {1, 2, 7}


def test_presets_declare_nothing() -> None:
    assert declared_stop_ids("tiny-llama") == set()


def test_reply_ends_before_the_first_stop_token() -> None:
    from graphrt.text.tokenizer import reply_tokens

    assert reply_tokens([5, 9, 2, 7, 2], {2, 3}) == [5, 9]
    assert reply_tokens([5, 9], {2}) == [5, 9]
    assert reply_tokens([3], {3}) == []
