"""A reply's text as its tokens arrive: incremental detokenization and stop strings.

``tokenizers.decoders.DecodeStream`` turns each token into the text it completes: a UTF-8
character split across byte-level tokens comes out whole once its last byte arrives, and
pieces that merge with the next token (a sentencepiece word start) wait for it. On top,
:class:`TextStream` holds back any tail that could still become a stop string, and cuts the
text before the first stop string found. What it hands out, joined, is the text of the tokens
it was given (``Tokenizer.decode``), cut before a stop string, less a last character whose
bytes never all arrived (a reply cut by its budget mid-character ends before it, not in U+FFFD).

Stop strings are bounded (:data:`MAX_STOPS` strings of at most :data:`MAX_STOP_CHARS`
characters): each token is matched against the last ``max(len(stop))`` characters only, so a
token's cost does not grow with the reply, and is bounded whatever the request.
"""

from __future__ import annotations

from collections.abc import Sequence

from graphrt.text.tokenizer import Tokenizer

#: Stop strings one reply may have (vLLM has no bound; OpenAI's API takes 4: graphrt serve's).
MAX_STOPS = 16
#: Characters one stop string may have.
MAX_STOP_CHARS = 256
#: U+FFFD, what a decode writes for bytes that are not a whole UTF-8 character.
REPLACEMENT = "\ufffd"


def stop_strings(stop: str | Sequence[str] | None, limit: int = MAX_STOPS) -> tuple[str, ...]:
    """``stop`` as a tuple of strings: a bare ``str`` is one stop string (not its characters).

    Raises ``ValueError`` naming the limit for more than ``limit`` strings, an empty one or one
    longer than :data:`MAX_STOP_CHARS`, and ``TypeError`` for anything but strings.
    """
    stops = (stop,) if isinstance(stop, str) else tuple(stop or ())
    for s in stops:
        if not isinstance(s, str):
            raise TypeError(f"stop strings must be str, got {type(s).__name__} {s!r:.40}")
        if not s or len(s) > MAX_STOP_CHARS:
            raise ValueError(
                f"stop strings must be non-empty and at most {MAX_STOP_CHARS} characters:"
                f" got one of {len(s)} ({s!r:.40})"
            )
    if len(stops) > limit:
        raise ValueError(f"stop: {len(stops)} stop strings: at most {limit} allowed")
    return stops


def _held(text: str, stops: Sequence[str]) -> int:
    """Characters at the end of ``text`` that begin some stop string (the longest such tail).

    NOTE: only the tail that could begin a stop is looked at, from each place its first
    character occurs: bounded by the stops' lengths, not by the text's.
    """
    longest = 0
    for stop in stops:
        tail = text[len(text) - min(len(stop) - 1, len(text)) :]
        i = tail.find(stop[0])
        while i >= 0 and len(tail) - i > longest:
            if stop.startswith(tail[i:]):
                longest = len(tail) - i
                break
            i = tail.find(stop[0], i + 1)
    return longest


class TextStream:
    """One reply: :meth:`push` each token, :meth:`finish` at the end; both return new text.

    ``stop``: strings that end the reply, none of them in the text handed out. Once one is
    found, :attr:`stopped` is set and later tokens add nothing.
    """

    def __init__(self, tokenizer: Tokenizer, stop: Sequence[str] = ()) -> None:
        from tokenizers.decoders import DecodeStream

        self.tokenizer, self.stop = tokenizer, stop_strings(stop)
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
        full decode writes it as U+FFFD at the end, which is left out: no reply ends in half a
        character (the tokens stay in ``ids``).
        """
        if not self.stopped:
            full = self.tokenizer.decode(self.ids)
            if full.startswith(self.text):
                self.text += full[len(self.text) :].rstrip(REPLACEMENT)
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
