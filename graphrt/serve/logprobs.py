"""Log-probabilities in OpenAI's two wire shapes (chat's ``content`` list, completions' columns).

The values come from the engine (:class:`~graphrt.runtime.logprobs.TokenLogprobs`: the chosen
token's and the best ``k`` of its step, ``log_softmax`` of the raw logits); a token's text is
its own decoding (special tokens kept), so a token that is part of a multi-byte character
reads as ``\\ufffd``, as in vLLM.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from graphrt.runtime.logprobs import TokenLogprobs
from graphrt.text.tokenizer import Tokenizer


class LogprobText:
    """Renders log-probabilities for one model's tokenizer (token texts and their UTF-8 bytes
    cached by id: a token is decoded once, however many replies name it)."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self._tokens: dict[int, tuple[str, list[int]]] = {}

    def _token(self, token: int) -> tuple[str, list[int]]:
        """``token``'s text and its UTF-8 bytes (NOTE: the cached list is shared by every
        entry that names the token: entries are serialised, never modified)."""
        got = self._tokens.get(token)
        if got is None:
            text = self.tokenizer.decode([token], skip_special_tokens=False)
            got = self._tokens[token] = (text, list(text.encode("utf-8")))
        return got

    def text(self, token: int) -> str:
        return self._token(token)[0]

    def _entry(self, token: int, logprob: float) -> dict[str, Any]:
        text, raw = self._token(token)
        return {"token": text, "logprob": logprob, "bytes": raw}

    def chat(self, entries: Sequence[TokenLogprobs]) -> dict[str, Any]:
        """Chat's ``choice.logprobs``: ``{"content": [{token, logprob, bytes, top_logprobs}]}``."""
        content = []
        for e in entries:
            top = [self._entry(t, v) for t, v in zip(e.top_ids, e.top_logprobs, strict=True)]
            content.append(self._entry(e.token, e.logprob) | {"top_logprobs": top})
        return {"content": content}

    def completion(self, entries: Sequence[TokenLogprobs], offset: int = 0) -> tuple[dict[str, Any], int]:
        """Completions' ``choice.logprobs`` (``tokens``, ``token_logprobs``, ``top_logprobs``,
        ``text_offset`` from ``offset``) and the offset after its last token."""
        tokens = [self.text(e.token) for e in entries]
        offsets = []
        for t in tokens:
            offsets.append(offset)
            offset += len(t)
        top = [{self.text(t): v for t, v in zip(e.top_ids, e.top_logprobs, strict=True)} for e in entries]
        body = {
            "tokens": tokens,
            "token_logprobs": [e.logprob for e in entries],
            "top_logprobs": top,
            "text_offset": offsets,
        }
        return body, offset


class ChoiceLogprobs:
    """One choice's rendering as it streams: completions' ``text_offset`` carries on."""

    def __init__(self, text: LogprobText, chat: bool, offset: int = 0) -> None:
        self.render, self.chat, self.offset = text, chat, offset

    def __call__(self, entries: Sequence[TokenLogprobs] | None) -> dict[str, Any] | None:
        if entries is None:
            return None
        if self.chat:
            return self.render.chat(entries)
        body, self.offset = self.render.completion(entries, self.offset)
        return body
