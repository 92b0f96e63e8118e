"""Requests that follow a grammar: their allowed-token masks written before each step, their
tokens accepted after it.

A request's ``constraint`` (:class:`graphrt.text.grammar.Constraint`, or any object with
``fill(bitmask, index)``, writing row ``index`` of a ``[n, words]`` int32 CPU tensor as
xgrammar's ``GrammarMatcher.fill_next_token_bitmask`` does, and ``accept(output)``) says which
tokens it may sample next; the runtime keeps one mask per request row
(:class:`~graphrt.runtime.token_mask.TokenMasks`) and applies it inside the sampling step.
Masks are filled in place in the runtime's host staging rows (pinned on CUDA) and uploaded
with one copy. A prefill writes every admitted row (all tokens allowed where unconstrained, so
a reused row holds nothing stale); a decode step writes the constrained rows only. The next
mask needs the last token accepted, so an overlapped engine writes a constrained batch's masks
after the next step's metadata, reading the step in flight in between
(:func:`graphrt.engine.step_run.read_then_mask`): graphed, while the step's forward graph runs
and before its sampler graph (:mod:`graphrt.runtime.split_pairs`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from graphrt.runtime.token_mask import ALL, TokenMasks

if TYPE_CHECKING:
    from graphrt.engine.request import Request


def check_constraint(constraint: object, supported: bool) -> None:
    """``ValueError`` for a constraint on an engine that keeps no masks."""
    if constraint is not None and not supported:
        raise ValueError(
            "constrained decoding (a grammar) needs an engine that keeps token masks: "
            "Engine(token_masks=True) (not with speculative, record_logits or tp > 1)"
        )


class Constraints:
    """The engine's side of the runtime's masks (None: the runtime keeps none)."""

    def __init__(self, masks: TokenMasks | None) -> None:
        self.masks = masks

    def write(self, reqs: Sequence[Request], fresh: bool = False) -> None:
        """Write the masks of ``reqs``' rows: constrained ones from their grammar state, the
        others (only when ``fresh``: rows starting a request) all-allowed."""
        masks = self.masks
        if masks is None:
            return
        chosen = [r for r in reqs if fresh or r.constraint is not None]
        if not chosen:
            return
        host, host_np = masks.staging()
        for i, r in enumerate(chosen):
            if r.constraint is not None:
                r.constraint.fill(host, i)
            else:
                host_np[i] = ALL
        grammar = np.array([r.constraint is not None for r in chosen])
        masks.upload(np.array([r.req_idx for r in chosen], dtype=np.int64), grammar)


def accept(reqs: Sequence[Request]) -> None:
    """Each constrained request of ``reqs`` accepts the tokens it has not yet."""
    for r in reqs:
        if r.constraint is not None:
            r.constraint.accept(r.output)
