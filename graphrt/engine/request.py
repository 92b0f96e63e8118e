"""A request's life in the engine, and what the engine reports."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from graphrt.engine.speculative import SpecRunner, SpecState
from graphrt.runtime.report import RuntimeStats
from graphrt.step.ints import count, int_list
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
    #: Tokens launched but not read yet (an overlapped engine reads each step one step late).
    inflight: int = 0

    @property
    def launched_all(self) -> bool:
        """Every token up to ``max_new_tokens`` is read or in flight: no step needs to run."""
        return len(self.output) + self.inflight >= self.max_new_tokens

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

    accepted_per_position: tuple[int, ...] = ()


def check_prompt(
    prompt: Sequence[int],
    max_new_tokens: int,
    vocab: int,
    lookahead: int,
    max_context_len: int,
    name: str = "prompt",
) -> list[int]:
    """The prompt's token ids as Python ints.

    ``TypeError`` for a prompt that is not a list of ints (or a 1-D integer array) or a budget
    that is not an int, naming ``name`` and the index; ``ValueError`` for an empty prompt, an
    id outside ``[0, vocab)``, a budget below 1 or a request that cannot fit
    ``max_context_len`` (with ``lookahead`` draft positions).
    """
    tokens = int_list(name, prompt)
    budget = count(f"max_new_tokens for {name}" if name != "prompt" else "max_new_tokens", max_new_tokens)
    if not tokens:
        raise ValueError(f"{name} is empty")
    bad = [i for i, t in enumerate(tokens) if not 0 <= t < vocab]
    if bad:
        raise ValueError(f"token id {tokens[bad[0]]} out of range [0, {vocab}) at {name}[{bad[0]}]")
    if budget < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {budget}")
    if len(tokens) + max_new_tokens + lookahead > max_context_len:
        drafts = f" + {lookahead} draft tokens" if lookahead else ""
        raise ValueError(
            f"prompt of {len(tokens)} tokens + max_new_tokens {max_new_tokens}{drafts} "
            f"exceeds max_context_len {max_context_len}"
        )
    return tokens


def engine_stats(
    rt: RuntimeStats,
    decode_steps: int,
    decode_seconds: float,
    prefill_steps: int,
    generated: int,
    spec: SpecRunner | None,
) -> EngineStats:
    """An engine's counters: its runtime's, its own, and the speculative runner's."""
    stats = EngineStats(
        rt.replays, rt.eager, rt.fallbacks, decode_steps, decode_seconds, prefill_steps, generated
    )
    if spec is None:
        return stats
    acc = spec.stats
    return dataclasses.replace(
        stats,
        draft_replays=spec.draft.stats().replays,
        verify_steps=acc.verify_steps,
        acceptance_rate=acc.rate,
        mean_accept_length=acc.mean_accept_length,
        accepted_per_position=tuple(acc.per_position),
    )
