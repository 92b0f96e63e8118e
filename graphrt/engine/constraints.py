"""Requests that follow a grammar: their allowed-token masks written before each step, their
tokens accepted after it.

A request's ``constraint`` (:class:`graphrt.text.grammar.Constraint`, or any object with
``fill(bitmask, index)``, writing row ``index`` of a ``[n, words]`` int32 CPU tensor as
xgrammar's ``GrammarMatcher.fill_next_token_bitmask`` does, and ``accept(output)``; a static
``fill_rows(constraints, bitmask, rows)`` where its kind fills many rows at once) says which
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
from typing import TYPE_CHECKING, Any

import numpy as np

from graphrt.runtime.token_mask import ALL, TokenMasks

if TYPE_CHECKING:
    import torch

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
        rows = [i for i, r in enumerate(chosen) if r.constraint is not None]
        fill_masks(host, [chosen[i].constraint for i in rows], rows)
        grammar = np.array([r.constraint is not None for r in chosen])
        host_np[: len(chosen)][~grammar] = ALL
        masks.upload(np.array([r.req_idx for r in chosen], dtype=np.int64), grammar)


def fill_masks(host: torch.Tensor, constraints: Sequence[Any], rows: list[int]) -> None:
    """Row ``rows[k]`` of ``host [n, words]`` from ``constraints[k]``: one ``fill_rows`` call per
    kind of constraint that has it, for two rows or more (xgrammar's fills them on its own
    threads), else ``fill`` row by row."""
    kinds: dict[type, list[int]] = {}
    for k, c in enumerate(constraints):
        kinds.setdefault(type(c), []).append(k)
    for kind, ks in kinds.items():
        many = getattr(kind, "fill_rows", None)
        if many is not None and len(ks) > 1:
            many([constraints[k] for k in ks], host, [rows[k] for k in ks])
            continue
        for k in ks:
            constraints[k].fill(host, rows[k])


def accept(reqs: Sequence[Request]) -> None:
    """Each constrained request of ``reqs`` accepts the tokens it has not yet."""
    for r in reqs:
        if r.constraint is not None:
            r.constraint.accept(r.output)
