"""What an engine reports: :class:`EngineStats`, gathered from its runtime, scheduler and
speculative runner."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from graphrt.engine.lookup import LookupRunner
from graphrt.engine.prefix_cache import PrefixStats
from graphrt.engine.speculative import SpecRunner
from graphrt.runtime.report import RuntimeStats


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
    #: Tokens committed per request per speculative step, verify or backed-off DECODE alike.
    tokens_per_round: float = 0.0
    #: Why drafts were not made (``graphrt.engine.backoff.BackoffCounts``), proposer methods.
    backoff: dict[str, int] = field(default_factory=dict)
    #: Prefix-cache hits, evictions and collisions; None when the engine caches no prefixes.
    prefix: PrefixStats | None = None
    #: Chunked prefill's steps holding decode rows and prompt chunks (one MIXED batch each; its
    #: graph replays are ``replays["MIXED"]``, prefill-only chunks' and prefill graphs' among
    #: them: without chunking, ``replays["MIXED"]`` counts the prefill steps that replayed).
    mixed_steps: int = 0
    #: Whether speculative rounds overlap (``graphrt.engine.spec_ahead``): round n+1 launched
    #: before round n is read.
    spec_overlap: bool = False
    #: Drafts offered and accepted over all verifies (``acceptance_rate`` is their ratio).
    drafts_proposed: int = 0
    drafts_accepted: int = 0
    #: Running requests sitting out a back-off pause now (proposer methods).
    paused_requests: int = 0

    def speculation(self) -> dict[str, Any]:
        """The speculative counters as one flat dict (``graphrt inspect``, the TUI); {} when the
        engine does not speculate."""
        if not self.verify_steps and not self.backoff and not self.spec_overlap:
            return {}
        rates = {
            "acceptance_rate": round(self.acceptance_rate, 4),
            "tokens_per_round": round(self.tokens_per_round, 4),
        }
        return {
            "overlapped": self.spec_overlap, **rates, "mean_accept_length": round(self.mean_accept_length, 4),
            "verify_steps": self.verify_steps, "drafts_proposed": self.drafts_proposed,
            "drafts_accepted": self.drafts_accepted, "paused_requests": self.paused_requests, **self.backoff,
        }  # fmt: skip

    #: Graphs captured per mode and bucket (``RuntimeStats.captures``; lazy: as steps need them).
    captures: dict[str, dict[int, int]] = field(default_factory=dict)

    @property
    def acceptance_per_step(self) -> tuple[float, ...]:
        """Per draft step (tree depth) ``i``: the fraction of verifies that accepted it."""
        n = self.verify_steps
        return tuple(c / n if n else 0.0 for c in self.accepted_per_position)


def engine_stats(
    rt: RuntimeStats, sched: Any, generated: int, spec: SpecRunner | LookupRunner | None
) -> EngineStats:
    """An engine's counters: its runtime's, its scheduler's (``sched``: steps, decode time,
    the prefix cache's), ``generated`` tokens and the speculative runner's."""
    cache = sched.pool.cache
    counts = sched.counts
    stats = EngineStats(
        rt.replays,
        rt.eager,
        rt.fallbacks,
        counts.decode_steps,
        counts.decode_seconds,
        counts.prefill_steps,
        generated,
        prefix=cache.stats() if cache is not None else None,
        mixed_steps=counts.mixed_steps,
        captures=rt.captures,
    )
    if spec is None:
        return stats
    acc = spec.stats
    return dataclasses.replace(
        stats,
        draft_replays=spec.draft.stats().replays if spec.draft is not None else {},
        verify_steps=acc.verify_steps,
        acceptance_rate=acc.rate,
        mean_accept_length=acc.mean_accept_length,
        accepted_per_position=tuple(acc.per_position),
        tokens_per_round=spec.backoff.tokens_per_round,
        backoff=spec.backoff.as_dict() if spec.draft is None else {},
        spec_overlap=getattr(sched, "ahead", None) is not None,
        drafts_proposed=acc.proposed,
        drafts_accepted=acc.accepted,
        paused_requests=sum(r.spec.backoff.paused > 0 for r in sched.running),
    )
