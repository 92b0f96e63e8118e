"""The host half of an overlapped round (:mod:`.spec_ahead`): where each row starts, and its drafts.

A row's next round starts where its step in flight ends if that step commits what it assumed
(a DECODE: one token; a verify: every draft it offered); its drafts are the proposer's ``peek``
past that step's drafts. A row whose step in flight is stale, or that has none, starts at its
read tokens (``exact``: its pending token is written into the feed first) and proposes from them.
"""

from __future__ import annotations

import numpy as np

from graphrt.engine.backoff import BackoffCounts
from graphrt.engine.overlap import Launched
from graphrt.engine.request import Request

#: Per row: its base, proposer tail (None: propose from its read tokens), most drafts, exact.
Positions = tuple[list[Request], list[int], list[tuple[int, ...] | None], list[int], list[bool]]


def positions(live: list[Request], inflight: object, steps: int, prior: bool = True) -> Positions:
    """The rows of the next round among ``live`` (in order) given the step ``inflight``; ``steps``:
    the most drafts a row may take (0: none drafts). A row is left out when its budget is spent
    if the step in flight commits as assumed, or when that step is a verify of its drafts and its
    last verify accepted less than all (``SpecState.full``; ``prior`` for a request's first
    verify): a stale row would cost it the round anyway, and writes nothing when left out."""
    decoding: dict[int, tuple[int, bool]] = {}
    if isinstance(inflight, Launched) and inflight.rows is not None:  # NOTE: a DECODE in flight
        stale = inflight.stale or set()
        ends = inflight.rows.seq_lens.tolist()
        decoding = {id(r): (b, id(r) in stale) for r, b in zip(inflight.rows.reqs, ends, strict=True)}
    reqs, bases, tails, depths, exact = [], [], [], [], []
    for r in live:
        tail: tuple[int, ...] | None = ()
        known = decoding.get(id(r))
        if known is not None:
            base, fresh = known
        else:
            f = r.spec.ahead
            fresh = f is None or not f.valid
            if not fresh and f.drafts and not (prior if r.spec.full is None else r.spec.full):
                continue
            if not fresh:
                base, tail = f.next_base, f.drafts
        if fresh:
            base, tail = len(r.prompt) + len(r.output), None
        left = r.max_new_tokens - (base - len(r.prompt))
        if left <= 0:
            continue  # NOTE: the step in flight ends it if it commits as assumed; else a later round
        reqs.append(r)
        bases.append(base)
        tails.append(tail)
        depths.append(min(steps, left - 1))
        exact.append(fresh)
    return reqs, bases, tails, depths, exact


def propose(
    reqs: list[Request],
    tails: list[tuple[int, ...] | None] | None,
    depths: int | np.ndarray | list[int],
    steps: int,
    counts: BackoffCounts,
) -> list[list[int]] | None:
    """Each row's drafts, or None when no row drafts (a paused row sits out, counted).

    ``tails``: per row, the drafts of its step in flight assumed accepted (None: propose from
    its read tokens); None: every row's is ``()``. ``depths``: the most drafts per row (an
    int: every row's); ``steps``: the chain length.
    """
    chains = None
    if isinstance(depths, np.ndarray):
        depths = depths.tolist()
    for i, r in enumerate(reqs):
        depth = depths if isinstance(depths, int) else depths[i]
        if depth <= 0:
            continue
        if r.spec.backoff.sits_out():
            counts.paused_rows += 1
            continue
        tail = () if tails is None else tails[i]
        if tail is None:
            branches = r.spec.proposer.propose(r.prompt, r.output)
            chain = branches[0][:depth] if branches else []
        else:  # NOTE: the peeked chain's first token guesses the last token of the step in flight
            chain = r.spec.proposer.peek(r.prompt, r.output, tail, steps + 1)[1 : depth + 1]
        if not chain:
            counts.no_match_rows += 1
            continue
        if chains is None:
            chains = [[] for _ in reqs]
        chains[i] = chain
    return chains
