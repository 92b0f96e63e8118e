"""A reply's text as its tokens arrive: incremental detokenization and stop strings.

``tokenizers.decoders.DecodeStream`` turns each token into the text it completes: a UTF-8
character split across byte-level tokens comes out whole once its last byte arrives, and
pieces that merge with the next token (a sentencepiece word start) wait for it. On top,
:class:`TextStream` holds back any tail that could still become a stop string, and cuts the
text before the first stop string found. What it hands out, joined, is the text of the tokens
it was given (``Tokenizer.decode``), cut before a stop string.
"""

from __future__ import annotations

from collections.abc import Sequence

from graphrt.text.tokenizer import Tokenizer


def _held(text: str, stops: Sequence[str]) -> int:
    """Characters at the end of ``text`` that begin some stop string (the longest such tail)."""
    longest = 0
    for stop in stops:
        for k in range(min(len(stop) - 1, len(text)), longest, -1):
            if text.endswith(stop[:k]):
                longest = k
                break
    return longest


class TextStream:
    """One reply: :meth:`push` each token, :meth:`finish` at the end; both return new text.

    ``stop``: strings that end the reply, none of them in the text handed out. Once one is
    found, :attr:`stopped` is set and later tokens add nothing.
    """

    def __init__(self, tokenizer: Tokenizer, stop: Sequence[str] = ()) -> None:
        from tokenizers.decoders import DecodeStream

        bad = [s for s in stop if not isinstance(s, str) or not s]
        if bad:
            raise ValueError(f"stop strings must be non-empty strings, got {bad[0]!r}")
        self.tokenizer, self.stop = tokenizer, tuple(stop)
        self._decoder = DecodeStream(skip_special_tokens=True)
        self.ids: list[int] = []
        self.text = ""  # decoded so far, cut before a stop string once one is found
        self.sent = 0  # characters of ``text`` handed out
        self.stopped = False

    def push(self, token: int) -> str:
        """Add ``token``; the text now safe to show (may be empty)."""
        if self.stopped:
            return ""
        self.ids.append(token)
        chunk = self._decoder.step(self.tokenizer.backend, token)
        if chunk:
            self.text += chunk
        return self._release(final=False)

    def finish(self) -> str:
        """The reply ended: the text still held back, as the whole reply's decode gives it.

        NOTE: a byte sequence that never completes a character stays in the decoder; the
        full decode writes it as U+FFFD, so the joined pieces equal ``decode(ids)``.
        """
        if not self.stopped:
            full = self.tokenizer.decode(self.ids)
            if full.startswith(self.text):
                self.text = full
        return self._release(final=True)

    def _release(self, *, final: bool) -> str:
        if self.stop and not self.stopped:
            start = max(0, self.sent - max(len(s) for s in self.stop))
            hits = [i for s in self.stop if (i := self.text.find(s, start)) >= 0]
            if hits:
                self.text, self.stopped = self.text[: min(hits)], True
        end = len(self.text)
        if self.stop and not self.stopped and not final:
            end -= _held(self.text, self.stop)
        out, self.sent = self.text[self.sent : end], max(self.sent, end)
        return out
