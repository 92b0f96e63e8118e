"""Speculative decoding from proposers (``ngram``, ``suffix``): no draft model, one graph a round.

A round: each request's proposer offers branches (:mod:`.proposers`); rows that draft nothing
(no match, paused, budget spent: :mod:`.backoff`) carry pad drafts that never match → one
TARGET_VERIFY (chain, or tree for ``topk > 1``) whose graph also gives the target's token after
every node (argmax or sampled draw) → acceptance on the host, the accepted path's KV moved into
place (trees). When no row drafts (or above ``disable_batch_size``) :meth:`propose` says so and
the scheduler runs a plain DECODE step instead: both graphs are captured.

Invariant between steps, for a request with ``m`` committed tokens: the target's KV holds
positions ``0 .. m-2`` and the last committed token is pending, as in DECODE, so verify rounds
and DECODE steps interleave freely.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from graphrt.engine.backoff import BackoffCounts
from graphrt.engine.pages import page_table
from graphrt.engine.proposers import PROPOSERS
from graphrt.engine.spec_options import SpecOptions
from graphrt.engine.spec_tree import TreeLayout
from graphrt.engine.speculative import Acceptance
from graphrt.engine.verify import move_path, verify


@dataclass(frozen=True, slots=True)
class Drafts:
    """One round's drafts: ``tokens [bs, topk, steps]`` int64 and ``valid`` (same shape, bool:
    proposed, not padding)."""

    tokens: np.ndarray
    valid: np.ndarray

    @property
    def offered(self) -> np.ndarray:
        """``[bs]``: the deepest path each row could accept (0: a pad row)."""
        return self.valid.sum(axis=2).max(axis=1)


class LookupRunner:
    """Proposer-driven rounds for the scheduler (the module docstring says how).

    ``target``: the target's runtime (captures TARGET_VERIFY and DECODE, samples in-graph);
    ``target_kv``: its KV cache (a tree's accepted path is moved there).
    """

    draft = None  # NOTE: no draft model (the engine's stats read ``draft`` of any runner)

    def __init__(self, target: Any, options: SpecOptions, page_size: int, target_kv: Any) -> None:
        self.target, self.options, self.page_size, self.target_kv = target, options, page_size, target_kv
        self.geometry = options.geometry
        self.tree = TreeLayout.of(options.geometry)
        self.make = PROPOSERS[options.method]
        self.stats = Acceptance(per_position=[0] * self.tree.max_depth)
        self.backoff = BackoffCounts()

    @property
    def lookahead(self) -> int:
        """KV positions a request may write past its last token: the verify's nodes."""
        return self.geometry.num_draft_tokens

    def start(self, reqs: Sequence[Any], eager: bool) -> None:
        """After the target's prefill: give each request its proposer."""
        for r in reqs:
            r.spec.proposer = self.make(self.options)

    def propose(self, reqs: Sequence[Any]) -> Drafts | None:
        """This step's drafts, or None: no row drafts (the step is a plain DECODE)."""
        g, policy, counts = self.geometry, self.options.backoff, self.backoff
        if policy.disable_batch_size and len(reqs) > policy.disable_batch_size:
            counts.batch_steps += 1
            counts.decode_steps += 1
            return None
        drafted: list[tuple[int, list[list[int]]]] = []  # NOTE: (row, branches cut to depth)
        for i, r in enumerate(reqs):
            if r.spec.backoff.sits_out():
                counts.paused_rows += 1
                continue
            depth = min(g.num_steps, r.max_new_tokens - len(r.output) - 1)
            if depth <= 0:
                continue
            branches = [b[:depth] for b in r.spec.proposer.propose(r.prompt, r.output) if b]
            if branches:
                drafted.append((i, branches))
            else:
                counts.no_match_rows += 1
        if not drafted:  # NOTE: a backed-off step: no arrays made, the scheduler decodes
            counts.decode_steps += 1
            return None
        tokens = np.zeros((len(reqs), g.topk, g.num_steps), dtype=np.int64)
        valid = np.zeros(tokens.shape, dtype=bool)
        for i, branches in drafted:
            for j, cut in enumerate(branches):
                tokens[i, j, : len(cut)], valid[i, j, : len(cut)] = cut, True
        return Drafts(tokens, valid)

    def round(self, reqs: Sequence[Any], drafts: Drafts, eager: bool) -> list[list[int]]:
        """One verify of ``drafts``; returns the tokens each request commits."""
        committed = np.array([len(r.prompt) + len(r.output) for r in reqs])
        table, rows = page_table(reqs), np.array([r.req_idx for r in reqs], dtype=np.int64)
        at = (rows, table, committed)
        predicted = verify(self.target, self.tree, reqs, at, drafts.tokens, self.page_size, eager)
        acc = self.tree.accept(drafts.tokens, predicted, drafts.valid)
        move_path(self.target_kv, self.tree, table, committed, acc, self.page_size)
        offered = drafts.offered
        drafted = offered > 0
        self.stats.count(acc.length[drafted], offered[drafted])
        self.backoff.pad_rows += int((~drafted).sum())
        policy, new = self.options.backoff, []
        for r, d, b, a, t, n in zip(
            reqs, drafts.tokens, acc.branch, acc.length, acc.bonus, offered, strict=True
        ):
            if n > 0:
                self.backoff.pauses += r.spec.backoff.observe(int(a), int(n), policy)
            new.append([*d[b, :a].tolist(), int(t)])
        return new
