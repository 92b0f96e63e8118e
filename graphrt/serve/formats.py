"""``response_format``: a request's JSON mode or JSON schema, compiled once per format.

xgrammar is imported on the first request that asks (``GrammarError`` and a missing package
are a 400 naming ``response_format``); ``{"type": "text"}`` or no field asks nothing.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from graphrt.serve.protocol import RequestError
from graphrt.text.tokenizer import Tokenizer


class Formats:
    """The response formats of one served model (its tokenizer and vocabulary)."""

    def __init__(self, tokenizer: Tokenizer, vocab_size: int) -> None:
        self.tokenizer, self.vocab_size = tokenizer, vocab_size
        self._grammars: Any = None

    def constraint(self, response_format: dict[str, Any] | None) -> Callable[[], Any] | None:
        """What makes each choice's grammar state, or None (no constraint)."""
        if response_format is None or response_format.get("type") == "text":
            return None
        try:
            from graphrt.text.grammar import GrammarError, Grammars
        except ImportError as err:
            raise RequestError(
                f"response_format needs xgrammar (pip install xgrammar): {err}", "response_format"
            ) from err
        if self._grammars is None:
            self._grammars = Grammars(self.tokenizer, self.vocab_size)
        try:
            compiled = self._grammars.compile(response_format)
        except GrammarError as err:
            raise RequestError(str(err), "response_format") from err
        return functools.partial(self._grammars.constraint, compiled)
