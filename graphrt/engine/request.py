"""A request's life in the engine: its state and the checks of what it asks for."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from graphrt.engine.backoff import RowBackoff
from graphrt.runtime.logprobs import TokenLogprobs
from graphrt.step.ints import count, is_int, token_ids
from graphrt.step.sampling import SamplingParams


@dataclass(slots=True)
class SpecState:
    """Per request: the draft's ``topk`` best guesses for the next position, best first; or
    (proposer methods) its proposer and back-off state."""

    draft_tokens: tuple[int, ...] = ()
    proposer: Any = None  # NOTE: graphrt.engine.proposers.Proposer, made at the first round
    backoff: RowBackoff = field(default_factory=RowBackoff)
    #: Overlapped rounds: its part in the step launched last and not read yet
    #: (``graphrt.engine.spec_layout.Flight``), or None.
    ahead: Any = None
    #: Overlapped rounds: whether its last verify accepted every draft it offered (else the
    #: round launched while its next verify runs leaves it out: ``graphrt.engine.spec_ahead``);
    #: None before its first verify.
    full: bool | None = None


@dataclass(frozen=True, slots=True)
class GenerateCall:
    """One :meth:`~graphrt.Engine.generate` call's arguments as given (checked when it runs;
    its docstring says what each may be). Under TP rank 0's call is shared with every rank."""

    prompts: Sequence[Sequence[int]]
    max_new_tokens: int | Sequence[int]
    sampling: SamplingParams | Sequence[SamplingParams] | None = None
    encoder_ids: Sequence[Sequence[int]] | None = None


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
    #: Prefill tokens launched but not read yet (an overlapped engine reads each step one step
    #: late); its fed DECODE step in flight is not counted here (``Overlap.pending``).
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
    #: The prefix cache's chain keys of the prompt's full pages (``PrefixCache.keys``), made
    #: once, when the request is first considered for admission; None: not yet.
    page_keys: list[int] | None = None

    @property
    def launched_all(self) -> bool:
        """Every token up to ``max_new_tokens`` is read or in flight: no step needs to run
        (read right after a prefill is launched, when ``inflight`` counts every token in flight)."""
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
