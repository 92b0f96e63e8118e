"""Constrained decoding through xgrammar: JSON mode and JSON schemas as per-token bitmasks.

:class:`Grammars` (one per tokenizer) compiles a response format once (xgrammar's
``GrammarCompiler``, cached); each request gets its own :class:`Constraint` (a
``GrammarMatcher``): before a step that samples for the request the engine asks it for the
allowed tokens (:meth:`Constraint.fill`, written straight into a host staging row of
:class:`~graphrt.runtime.token_mask.TokenMasks`), and after the step it accepts the token drawn.
The grammar lets a stop token through only where the output is complete.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from graphrt.text.tokenizer import Tokenizer

if TYPE_CHECKING:
    import torch

#: xgrammar's vocabulary kinds by the tokenizer's decoder (``tokenizer.json``'s ``decoder.type``).
VOCAB_TYPES = {"ByteLevel": "BYTE_LEVEL", "ByteFallback": "BYTE_FALLBACK", "Sequence": "BYTE_FALLBACK"}


class GrammarError(ValueError):
    """A response format that cannot be compiled (the message says why)."""


class Constraint:
    """One request's grammar state: the tokens it may take next, and the tokens it took."""

    def __init__(self, compiled: Any, vocab_size: int) -> None:
        import xgrammar as xgr

        self.matcher = xgr.GrammarMatcher(compiled)
        self.vocab_size = vocab_size
        #: Output tokens accepted so far.
        self.accepted = 0

    def fill(self, bitmask: torch.Tensor, index: int) -> None:
        """Write the allowed next tokens into row ``index`` of ``bitmask [n, ceil(vocab / 32)]``
        (int32, on the CPU), in place: no allocation, no copy."""
        self.matcher.fill_next_token_bitmask(bitmask, index)

    def accept(self, output: list[int]) -> None:
        """Accept the tokens of ``output`` past :attr:`accepted` (a refused one raises)."""
        for token in output[self.accepted :]:
            if not self.matcher.is_terminated() and not self.matcher.accept_token(token):
                raise RuntimeError(f"token {token} breaks the grammar it was sampled under")
            self.accepted += 1


class Grammars:
    """The response formats of one tokenizer, compiled once each."""

    def __init__(self, tokenizer: Tokenizer, vocab_size: int) -> None:
        import xgrammar as xgr

        backend = tokenizer.backend
        vocab = backend.get_vocab(with_added_tokens=True)
        encoded = [""] * vocab_size
        for text, i in vocab.items():
            if i < vocab_size:
                encoded[i] = text
        decoder = (json.loads(backend.to_str()).get("decoder") or {}).get("type", "")
        kind = getattr(xgr.VocabType, VOCAB_TYPES.get(decoder, "RAW"))
        stops = sorted(tokenizer.stop_ids)
        info = xgr.TokenizerInfo(encoded, kind, vocab_size=vocab_size, stop_token_ids=stops)
        self.vocab_size = vocab_size
        self.compiler = xgr.GrammarCompiler(info, max_threads=1)
        self._cache: dict[str, Any] = {}

    def compile(self, response_format: Mapping[str, Any]) -> Any:
        """xgrammar's compiled grammar of an OpenAI ``response_format`` (``json_object`` or
        ``json_schema``); ``GrammarError`` names what is wrong."""
        kind = response_format.get("type")
        if kind == "json_object":
            key = "json_object"
        elif kind == "json_schema":
            spec = response_format.get("json_schema")
            schema = spec.get("schema") if isinstance(spec, Mapping) else None
            if not isinstance(schema, Mapping):
                raise GrammarError("response_format.json_schema.schema: a JSON schema object is required")
            key = json.dumps(schema, sort_keys=True)
        else:
            raise GrammarError(f"response_format.type = {kind!r}: allowed text, json_object, json_schema")
        compiled = self._cache.get(key)
        if compiled is None:
            try:
                compiled = (
                    self.compiler.compile_builtin_json_grammar()
                    if kind == "json_object"
                    else self.compiler.compile_json_schema(key, any_whitespace=False)
                )
            except RuntimeError as err:
                message = str(err).strip().splitlines()[-1]
                raise GrammarError(f"response_format.json_schema.schema is not usable: {message}") from err
            self._cache[key] = compiled
        return compiled

    def constraint(self, compiled: Any) -> Constraint:
        """A fresh request state of ``compiled``."""
        return Constraint(compiled, self.vocab_size)
