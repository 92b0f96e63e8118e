"""A GGUF's tokenizer from the conversion cache: the same ids, text, chat prompts, special tokens
and stop ids as the one built from the file, without parsing the GGUF; a damaged entry is
rebuilt; ``GRAPHRT_CACHE=0`` writes nothing. Each test has its own ``XDG_CACHE_HOME``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from graphrt.checkpoints import gguf_file
from graphrt.text import load_tokenizer
from graphrt.text.tokenizer import declared_stop_ids
from tests.text.test_tokenizer import CHATS, TEXTS, write_gguf
from tests.tools.test_cli_generate import needs_smollm2

pytest.importorskip("gguf")


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv("GRAPHRT_CACHE", raising=False)
    return tmp_path / "xdg" / "graphrt"


def assert_same(a: object, b: object) -> None:
    for attr in ("chat_template", "special", "stop_ids", "source"):
        assert getattr(a, attr) == getattr(b, attr), attr
    for text in TEXTS:
        ids = a.encode(text)  # type: ignore[attr-defined]
        assert ids == b.encode(text), text  # type: ignore[attr-defined]
        for skip in (True, False):
            assert a.decode(ids, skip_special_tokens=skip) == b.decode(ids, skip_special_tokens=skip)  # type: ignore[attr-defined]
    for chat in CHATS:
        assert a.encode_chat(chat) == b.encode_chat(chat)  # type: ignore[attr-defined]


def parse_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gguf_file, "_read", lambda *a: pytest.fail("the GGUF was parsed"))


def test_hit_is_the_built_tokenizer_without_parsing(
    cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write_gguf(tmp_path / "tok.gguf", "llama-bpe")
    built = load_tokenizer(path)
    stops = declared_stop_ids(path)
    assert [p.name for p in cache.glob("gguf/*/*")] == ["tokenizer.json"]
    parse_fails(monkeypatch)
    hit = load_tokenizer(path)
    assert_same(built, hit)
    assert declared_stop_ids(path) == stops == {1}


@pytest.mark.parametrize("damage", [b"", b"{not json", b'{"format": 1}', b'{"format": 999}'])
def test_damaged_entry_is_rebuilt(
    cache: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture, damage: bytes
) -> None:
    path = write_gguf(tmp_path / "tok.gguf", "qwen2")
    built = load_tokenizer(path)
    (file,) = cache.glob("gguf/*/tokenizer.json")
    whole = file.read_bytes()
    file.write_bytes(damage)
    with caplog.at_level("WARNING", logger="graphrt.cache"):
        again = load_tokenizer(path)
    assert "ignoring" in caplog.text
    assert_same(built, again)
    assert file.read_bytes() == whole


def test_cache_off_builds_and_writes_nothing(
    cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GRAPHRT_CACHE", "0")
    path = write_gguf(tmp_path / "tok.gguf", "default")
    assert load_tokenizer(path).source == "gguf"
    assert not cache.parent.exists()


@needs_smollm2
def test_smollm2_hit(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    built = load_tokenizer("smollm2")
    parse_fails(monkeypatch)
    hit = load_tokenizer("smollm2")
    assert_same(built, hit)
    assert hit.backend.to_str() == built.backend.to_str() and hit.stop_ids == {2}


@needs_smollm2
@pytest.mark.parametrize("damage", ["stop id out of range", "another file's entry"])
def test_an_entry_with_impossible_values_is_rebuilt_saying_so_once(
    cache: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture, damage: str
) -> None:
    """Red team (issue 40, row 10): stop ids out of range; the entry of another GGUF copied in."""
    from graphrt.checkpoints.loader import packaged_path

    built = load_tokenizer("smollm2")
    (file,) = cache.glob("gguf/*/tokenizer.json")
    whole = file.read_text(encoding="utf-8")
    record = json.loads(whole)
    if damage == "stop id out of range":
        record["stop_ids"] = [2, 10**9]
    else:
        other = write_gguf(tmp_path / "tok.gguf", "llama-bpe")
        load_tokenizer(other)
        record = json.loads(next(p for p in cache.glob("gguf/*/tokenizer.json") if p != file).read_text())
    file.write_text(json.dumps(record), encoding="utf-8")
    with caplog.at_level("WARNING", logger="graphrt.cache"):
        again = load_tokenizer(packaged_path("smollm2"))
        stops = declared_stop_ids("smollm2")
    warned = [r.getMessage() for r in caplog.records if "ignoring" in r.getMessage()]
    assert len(warned) == 1 and str(file) in warned[0], warned
    assert_same(built, again) and again.stop_ids == {2} and 2 in stops
    assert json.loads(file.read_text(encoding="utf-8"))["stop_ids"] == [2]
