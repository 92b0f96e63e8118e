"""A request's life in the engine, and what the engine reports."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from graphrt.engine.speculative import SpecState
from graphrt.step.sampling import SamplingParams


@dataclass(slots=True)
class Request:
    rid: int
    prompt: list[int]
    max_new_tokens: int
    output: list[int] = field(default_factory=list)
    req_idx: int = -1
    pages: list[int] = field(default_factory=list)
    spec: SpecState = field(default_factory=SpecState)
    sampling: SamplingParams | None = None  # None: greedy

    @property
    def done(self) -> bool:
        """At ``max_new_tokens``, or the last token is one of the request's stop tokens."""
        stops = self.sampling.stop_token_ids if self.sampling is not None else ()
        return len(self.output) >= self.max_new_tokens or bool(self.output and self.output[-1] in stops)

    def slots(self, start: int, stop: int, page_size: int) -> np.ndarray:
        return self.at(np.arange(start, stop), page_size)

    def at(self, pos: np.ndarray, page_size: int) -> np.ndarray:
        """The KV slot of each position in ``pos`` (int64) in this request's pages."""
        return np.asarray(self.pages)[pos // page_size] * page_size + pos % page_size


@dataclass(frozen=True, slots=True)
class EngineStats:
    """What :meth:`Engine.stats` reports: runtime counters plus decode and speculative totals."""

    replays: dict[str, int]
    eager: dict[str, int]
    fallbacks: dict[str, dict[str, int]]
    decode_steps: int
    decode_seconds: float
    prefill_steps: int
    generated_tokens: int
    draft_replays: dict[str, int] = field(default_factory=dict)
    verify_steps: int = 0  # per request: one draft → verify → extend round
    acceptance_rate: float = 0.0  # accepted drafts / (verifies × deepest acceptable path)
    mean_accept_length: float = 0.0  # tokens committed per request per round (incl. the bonus)
    accepted_per_position: tuple[int, ...] = ()  # verifies that accepted a draft at depth > i

    @property
    def acceptance_per_step(self) -> tuple[float, ...]:
        """Per draft step (tree depth) ``i``: the fraction of verifies that accepted it."""
        n = self.verify_steps
        return tuple(c / n if n else 0.0 for c in self.accepted_per_position)
