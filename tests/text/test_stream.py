"""``TextStream``: the pieces handed out join to the reply's decode (characters split across
byte-level tokens come out whole), never take text back, and stop before a stop string."""

from __future__ import annotations

from pathlib import Path

import pytest

from graphrt.text import load_tokenizer
from graphrt.text.stream import TextStream
from tests.text.test_tokenizer import write_gguf

pytest.importorskip("gguf")

TEXTS = ["plain ascii words", "é 中文 🎉🎉 한국어", "mixed: the café ☕ and 12 naïve", "\n\n  spaces  "]


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> object:
    return load_tokenizer(write_gguf(tmp_path_factory.mktemp("tok") / "tok.gguf", "llama-bpe"))


def run(stream: TextStream, ids: list[int]) -> list[str]:
    """Push ``ids``, checking each piece extends what came before; the pieces, finish last."""
    pieces = []
    for t in ids:
        pieces.append(stream.push(t))
        assert stream.text.startswith("".join(pieces))
    pieces.append(stream.finish())
    return pieces


@pytest.mark.parametrize("text", TEXTS)
def test_pieces_join_to_the_decode_and_are_whole_characters(tokenizer: object, text: str) -> None:
    ids = tokenizer.encode(text, add_special_tokens=False)  # type: ignore[attr-defined]
    assert len(ids) > len(text.encode()) // 2  # NOTE: a small vocabulary: mostly single bytes
    pieces = run(TextStream(tokenizer), ids)  # type: ignore[arg-type]
    assert "".join(pieces) == text
    assert not any("\ufffd" in p for p in pieces)
    multi = [p for p in pieces if any(len(ch.encode()) > 1 for ch in p)]
    assert bool(multi) == any(ord(ch) > 127 for ch in text)


def test_special_tokens_are_skipped_and_a_broken_last_character_is_left_out(tokenizer: object) -> None:
    ids = [0, *tokenizer.encode("ok 🎉", add_special_tokens=False)[:-1], 1]  # type: ignore[attr-defined]
    pieces = run(TextStream(tokenizer), ids)  # type: ignore[arg-type]
    # NOTE: the decode ends in U+FFFD; the stream ends before the character that never arrived
    assert tokenizer.decode(ids) == "ok \ufffd" and "".join(pieces) == "ok "  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("stop", "want"),
    [
        (["café"], "mixed: the "),
        (["naïve", "☕"], "mixed: the café "),  # the earliest stop string wins
        (["and 1", "zzz"], "mixed: the café ☕ "),
        (["naïvx"], "mixed: the café ☕ and 12 naïve"),  # a near miss is released at the end
    ],
)
def test_stop_strings(tokenizer: object, stop: list[str], want: str) -> None:
    ids = tokenizer.encode(TEXTS[2], add_special_tokens=False)  # type: ignore[attr-defined]
    stream = TextStream(tokenizer, stop)  # type: ignore[arg-type]
    pieces = run(stream, ids)
    assert "".join(pieces) == want and stream.text == want
    assert stream.stopped == (want != TEXTS[2])
    if stream.stopped:
        assert stream.push(ids[-1]) == "" and stream.finish() == ""


def test_held_back_text_is_a_stop_prefix_only(tokenizer: object) -> None:
    stream = TextStream(tokenizer, ["the end"])  # type: ignore[arg-type]
    shown = "".join(stream.push(t) for t in tokenizer.encode("so then the", add_special_tokens=False))  # type: ignore[attr-defined]
    assert shown == "so then " and stream.text == "so then the"


def test_bad_stop_strings(tokenizer: object, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="stop strings must be non-empty"):
        TextStream(tokenizer, [""])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="stop strings must be str"):
        TextStream(tokenizer, [3])  # type: ignore[list-item, arg-type]
