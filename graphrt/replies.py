"""Text requests over one :class:`~graphrt.Engine`: each token streamed as text, each reply ended
by a stop token, a stop string or its budget, and told as a :class:`Completion`.

:class:`Replies` is what ``graphrt.LLM`` and the server's engine thread both drive: ``add``,
then ``step`` until nothing is ``active`` (``abort`` to drop one). It owns no thread; the
engine's continuous batching runs every request added so far in the same steps.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from graphrt.engine import Engine
from graphrt.engine.request import Request
from graphrt.runtime.logprobs import TokenLogprobs
from graphrt.step.sampling import SamplingParams
from graphrt.text.stream import TextStream
from graphrt.text.tokenizer import Tokenizer

FinishReason = Literal["stop", "length"]


@dataclass(frozen=True, slots=True)
class Completion:
    """One finished reply.

    ``text``: the reply (special tokens skipped, cut before a stop string), None for a model
    without a tokenizer. ``token_ids``: the tokens generated, the stop token left out.
    ``finish_reason``: ``"stop"`` (a stop token or stop string) or ``"length"`` (the budget).
    ``completion_tokens`` counts every token generated, the stop token included.
    ``logprobs``: one entry per ``token_ids`` (``SamplingParams.logprobs`` set), else None.
    """

    text: str | None
    token_ids: list[int]
    finish_reason: FinishReason
    prompt_tokens: int
    completion_tokens: int
    logprobs: list[TokenLogprobs] | None = None


@dataclass(frozen=True, slots=True)
class Update:
    """What one step did for one request: new ``text`` (may be empty) and ``token_ids``, and
    ``done`` once the reply has ended."""

    rid: int
    text: str
    token_ids: list[int]
    done: Completion | None = None
    #: One entry per ``token_ids`` when the request asked for log-probabilities, else None.
    logprobs: list[TokenLogprobs] | None = None

    def then(self, later: Update) -> Update:
        """This update and ``later`` (the same request's next one) as one."""
        lp = None if self.logprobs is None or later.logprobs is None else self.logprobs + later.logprobs
        return Update(self.rid, self.text + later.text, self.token_ids + later.token_ids, later.done, lp)


@dataclass(slots=True)
class _Reply:
    prompt_tokens: int
    stop_ids: frozenset[int]
    stream: TextStream | None
    request: Request | None = None  # NOTE: the engine's, for its log-probabilities
    tokens: list[int] = field(default_factory=list)

    def logprobs(self, start: int, stop: int) -> list[TokenLogprobs] | None:
        """Tokens ``[start, stop)``'s log-probabilities, or None when not asked for."""
        r = self.request
        if r is None or r.sampling is None or r.sampling.logprobs is None:
            return None
        return r.logprobs[start:stop]

    def completion(self, reason: FinishReason) -> Completion:
        ids = self.tokens[:-1] if self.tokens and self.tokens[-1] in self.stop_ids else self.tokens
        text = None if self.stream is None else self.stream.text
        lp = self.logprobs(0, len(ids))
        return Completion(text, list(ids), reason, self.prompt_tokens, len(self.tokens), lp)


class Replies:
    """Text requests in flight on ``engine``; ``stop_ids``: tokens that end every reply (the
    model's EOS and the ids its checkpoint declares)."""

    def __init__(self, engine: Engine, tokenizer: Tokenizer | None, stop_ids: frozenset[int]) -> None:
        self.engine, self.tokenizer, self.stop_ids = engine, tokenizer, stop_ids
        self._live: dict[int, _Reply] = {}

    @property
    def active(self) -> bool:
        return bool(self._live)

    def add(
        self,
        prompt: Sequence[int],
        max_new_tokens: int,
        sampling: SamplingParams | None = None,
        stop: Sequence[str] = (),
        constraint: object = None,
    ) -> int:
        """Queue ``prompt`` (token ids); returns the request id. ``ValueError`` on bad input
        (nothing queued): see ``Engine.add_request``, and stop strings without a tokenizer.
        ``constraint``: a grammar the reply follows (``graphrt.text.grammar.Constraint``)."""
        if stop and self.tokenizer is None:
            raise ValueError("stop strings need a tokenizer: this model takes and gives token ids only")
        stream = None if self.tokenizer is None else TextStream(self.tokenizer, stop)
        params = sampling or SamplingParams()
        stops = frozenset(params.stop_token_ids) | self.stop_ids
        params = dataclasses.replace(params, stop_token_ids=tuple(sorted(stops)))
        rid = self.engine.add_request(prompt, max_new_tokens, params, constraint=constraint)
        self._live[rid] = _Reply(len(prompt), stops, stream, self.engine.scheduler.find(rid))
        return rid

    def abort(self, rid: int) -> None:
        """Drop request ``rid`` (the engine frees its row and pages); unknown ids are ignored."""
        if self._live.pop(rid, None) is not None:
            self.engine.abort(rid)

    def step(self) -> list[Update]:
        """One engine step; an :class:`Update` per request it touched, in the order added."""
        text: dict[int, list[str]] = {}
        for rid, token in self.engine.step():
            reply = self._live.get(rid)
            if reply is None:
                continue  # NOTE: a request that is not ours, or one already ended by a stop string
            reply.tokens.append(token)
            piece = reply.stream.push(token) if reply.stream is not None else ""
            text.setdefault(rid, []).append(piece)
        updates = []
        for rid, pieces in text.items():
            reply = self._live[rid]
            start = len(reply.tokens) - len(pieces)
            new = reply.tokens[start:]
            done = self._ended(rid, reply)
            tail = reply.stream.finish() if done is not None and reply.stream is not None else ""
            lp = reply.logprobs(start, len(reply.tokens))
            updates.append(Update(rid, "".join(pieces) + tail, new, done, lp))
        return updates

    def _ended(self, rid: int, reply: _Reply) -> Completion | None:
        """The reply's completion once it has ended (the request then leaves ``_live``)."""
        if reply.stream is not None and reply.stream.stopped:
            self.engine.abort(rid)  # NOTE: a stop string: the engine would run on
            reason: FinishReason = "stop"
        elif rid in self.engine.finished:
            self.engine.finished.pop(rid)
            reason = "stop" if reply.tokens and reply.tokens[-1] in reply.stop_ids else "length"
        else:
            return None
        del self._live[rid]
        return reply.completion(reason)
