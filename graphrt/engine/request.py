"""A request's life in the engine, and what the engine reports."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from graphrt.engine.lookup import LookupRunner
from graphrt.engine.prefix_cache import PrefixStats
from graphrt.engine.speculative import SpecRunner, SpecState
from graphrt.runtime.logprobs import TokenLogprobs
from graphrt.runtime.report import RuntimeStats
from graphrt.step.ints import count, is_int, token_ids
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
    #: An encoder-decoder model's encoder input, encoded into its row when it is admitted.
    encoder_ids: list[int] | None = None
    #: Each output token's log-probabilities (``SamplingParams.logprobs`` set; else empty).
    logprobs: list[TokenLogprobs] = field(default_factory=list)
    #: The grammar the output follows (``graphrt.text.grammar.Constraint``), if any.
    constraint: Any = None
    #: Prompt positions served from the prefix cache (whole pages at the start of ``pages``).
    cached: int = 0
    #: Prompt positions in the request's KV (cached or prefilled); chunked prefill's progress.
    prefilled: int = 0

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
    #: Tokens committed per request per speculative step, verify or backed-off DECODE alike.
    tokens_per_round: float = 0.0
    #: Why drafts were not made (``graphrt.engine.backoff.BackoffCounts``), proposer methods.
    backoff: dict[str, int] = field(default_factory=dict)
    #: Prefix-cache hits, evictions and collisions; None when the engine caches no prefixes.
    prefix: PrefixStats | None = None
    #: Chunked prefill's steps holding decode rows and prompt chunks (one MIXED batch each; its
    #: graph replays are ``replays["MIXED"]``, prefill-only chunks' among them).
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

    accepted_per_position: tuple[int, ...] = ()


def check_prompts(prompts: object) -> list[list[int]]:
    """Every prompt of a ``generate`` call as token ids (``TypeError`` names ``prompts[i][j]``)."""
    if isinstance(prompts, (str, bytes)) or not isinstance(prompts, Sequence):
        raise TypeError(f"prompts must be a sequence of token-id sequences, got {type(prompts).__name__}")
    return [token_ids(p, f"prompts[{i}]") for i, p in enumerate(prompts)]


def budgets(max_new_tokens: object, n: int) -> list[int]:
    """One ``max_new_tokens`` per prompt: an int for all, or a sequence of ``n`` ints."""
    limits = [max_new_tokens] * n if is_int(max_new_tokens) else max_new_tokens
    if not isinstance(limits, Sequence) or isinstance(limits, (str, bytes)):
        raise TypeError(f"max_new_tokens must be an int or a sequence of ints, got {max_new_tokens!r}")
    for i, v in enumerate(limits):
        if not is_int(v):
            raise TypeError(f"max_new_tokens[{i}] is {v!r} ({type(v).__name__}): budgets must be integers")
    if len(limits) != n:
        raise ValueError(f"{len(limits)} max_new_tokens for {n} prompts")
    return [int(v) for v in limits]


def check_prompt(
    prompt: Sequence[int], max_new_tokens: int, vocab: int, lookahead: int, max_context_len: int
) -> list[int]:
    """The prompt's token ids; ``TypeError`` for anything but integer ids and an integer budget,
    ``ValueError`` for an empty prompt, an id outside ``[0, vocab)``, a budget below 1 or a
    request that cannot fit ``max_context_len`` (with ``lookahead`` draft positions)."""
    tokens = token_ids(prompt)
    max_new_tokens = count("max_new_tokens", max_new_tokens)
    if not tokens:
        raise ValueError("prompt is empty")
    bad = [t for t in tokens if not 0 <= t < vocab]
    if bad:
        raise ValueError(f"token id {bad[0]} out of range [0, {vocab})")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if len(tokens) + max_new_tokens + lookahead > max_context_len:
        drafts = f" + {lookahead} draft tokens" if lookahead else ""
        raise ValueError(
            f"prompt of {len(tokens)} tokens + max_new_tokens {max_new_tokens}{drafts} "
            f"exceeds max_context_len {max_context_len}"
        )
    return tokens


def check_encoder_ids(model: Any, encoder: Any, encoder_ids: object) -> list[int] | None:
    """A request's encoder input as token ids, or None for a decoder-only model.

    ``ValueError`` when an encoder-decoder model (``encoder``: its cache) gets none, a
    decoder-only model gets one, or the ids are empty, too long or outside the encoder's
    vocabulary (the model's ``encoder_ids`` check names the value and the limit).
    """
    if encoder is None:
        if encoder_ids is not None:
            raise ValueError(
                "encoder_ids is for encoder-decoder models (tiny-cross); this model has no encoder"
            )
        return None
    if encoder_ids is None:
        raise ValueError("an encoder-decoder model needs each request's encoder input: pass encoder_ids")
    tokens = token_ids(encoder_ids, "encoder_ids")
    model.encoder_ids(tokens)
    return tokens


def engine_stats(
    rt: RuntimeStats, sched: Any, generated: int, spec: SpecRunner | LookupRunner | None
) -> EngineStats:
    """An engine's counters: its runtime's, its scheduler's (``sched``: steps, decode time,
    the prefix cache's), ``generated`` tokens and the speculative runner's."""
    cache = sched.pool.cache
    stats = EngineStats(
        rt.replays,
        rt.eager,
        rt.fallbacks,
        sched.decode_steps,
        sched.decode_seconds,
        sched.prefill_steps,
        generated,
        prefix=cache.stats() if cache is not None else None,
        mixed_steps=sched.mixed_steps,
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
