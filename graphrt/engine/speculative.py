"""Speculative decoding with a draft model, chain (``topk == 1``) or tree, graph per phase.

One round for the running requests: DRAFT_DECODE (the draft's remaining steps for each of the
``topk`` branches, one graph) → TARGET_VERIFY (the pending token plus the drafts; a tree mask
for ``topk > 1``, one graph; the target's token after every node, argmax or sampled draw, made
in that graph) → acceptance down the tree on the host → the accepted
path's target KV moved into position order (trees only) → DRAFT_EXTEND (the accepted tokens
and the bonus token, ragged, one graph), whose last logits give the next round's first drafts.

Invariant between rounds, for a request with ``m`` committed tokens: the target's KV holds
positions ``0 .. m-2`` (the last committed token is pending), the draft's KV holds
``0 .. m-1``, and ``draft_tokens`` are the draft's ``topk`` best guesses for position ``m``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from graphrt.engine.backoff import BackoffCounts
from graphrt.engine.batches import prefill_batch
from graphrt.engine.pages import page_table, slots_at
from graphrt.engine.spec_options import DRAFT_INITS, SpecOptions
from graphrt.engine.spec_tree import TreeLayout
from graphrt.engine.verify import move_path, verify
from graphrt.runtime import GraphRuntime
from graphrt.step.batch import Batch
from graphrt.step.modes import ForwardMode

__all__ = ["DRAFT_INITS", "Acceptance", "SpecOptions", "SpecRunner", "accept_greedy"]


@dataclass(slots=True)
class Acceptance:
    """Counts over verifies (one per request per round that drafted): drafts offered, accepted."""

    verify_steps: int = 0
    proposed: int = 0  # per verify the deepest path it could accept, summed
    accepted: int = 0
    per_position: list[int] = field(default_factory=list)  # verifies accepting depth > i

    @property
    def rate(self) -> float:
        return self.accepted / self.proposed if self.proposed else 0.0

    @property
    def mean_accept_length(self) -> float:
        """Tokens committed per request per verify (accepted drafts + the bonus token)."""
        return (self.accepted / self.verify_steps + 1.0) if self.verify_steps else 0.0

    def count(self, length: np.ndarray, offered: np.ndarray | None = None) -> None:
        """Add one verify per request, ``length [bs]`` drafts accepted by each; ``offered
        [bs]``: the deepest path each could accept (default: the tree's deepest)."""
        self.verify_steps += length.size
        self.proposed += length.size * len(self.per_position) if offered is None else int(offered.sum())
        self.accepted += int(length.sum())
        for i in range(len(self.per_position)):
            self.per_position[i] += int((length > i).sum())

    def add(self, length: int, offered: int) -> None:
        """:meth:`count` of one verify (ints: an overlapped round reads its rows one by one)."""
        self.verify_steps += 1
        self.proposed += offered
        self.accepted += length
        per = self.per_position
        for i in range(min(length, len(per))):
            per[i] += 1


def accept_greedy(drafts: np.ndarray, target: np.ndarray) -> np.ndarray:
    """Accepted draft count per request: the longest prefix with ``drafts[:, i] == target[:, i]``.

    ``drafts [bs, k]``, ``target [bs, k + 1]`` (the target's argmax after each verify token).
    """
    match = drafts == target[:, :-1]
    return np.where(match.all(axis=1), drafts.shape[1], np.argmin(match, axis=1))


class SpecRunner:
    """Runs the draft and verify phases for a list of requests (see the module docstring).

    ``target_kv``: the target's KV cache, where a tree's accepted path is moved into place.
    """

    def __init__(
        self, target: GraphRuntime, draft: GraphRuntime, options: SpecOptions, page_size: int, target_kv: Any
    ) -> None:
        self.target, self.draft, self.options, self.page_size = target, draft, options, page_size
        self.geometry, self.target_kv = options.geometry, target_kv
        self.tree = TreeLayout.of(options.geometry)
        self.stats = Acceptance(per_position=[0] * self.tree.max_depth)
        self.backoff = BackoffCounts()  # NOTE: a draft model never backs off; tokens per round

    @property
    def branch_stride(self) -> int:
        """Positions between two tree branches' scratch slots: whole pages, so each branch's
        step ``i`` sits at a slot aligned like its position ``m + i``, and ``>= steps``."""
        steps, ps = self.geometry.draft_forwards, self.page_size
        return -(-steps // ps) * ps

    @property
    def lookahead(self) -> int:
        """KV positions a request may write past its last token: the verify's nodes, and the
        draft's branch scratch slots (branch ``j`` at positions ``m + j * stride + i``)."""
        g = self.geometry
        return max(g.num_draft_tokens, (g.topk - 1) * self.branch_stride + g.draft_forwards)

    def start(self, reqs: Sequence[Any], eager: bool) -> None:
        """After the target's prefill: the draft reads prompt + first token, guesses the next."""
        if not reqs:
            return
        tokens = [[*r.prompt, *r.output] for r in reqs]
        batch = prefill_batch(reqs, self.page_size, tokens=tokens)
        logits = self.draft.run(batch, eager=eager)
        self._set_guesses(reqs, logits[np.cumsum(batch.q_lens) - 1])

    def propose(self, reqs: Sequence[Any]) -> bool:
        """A draft model drafts every round (its KV follows the target's): always a round."""
        return True

    def round(self, reqs: Sequence[Any], proposal: object, eager: bool) -> list[list[int]]:
        """One draft → verify → extend round; returns the tokens each request commits."""
        committed = np.array([len(r.prompt) + len(r.output) for r in reqs])
        # NOTE: the pages and rows of the round's requests as arrays, once: every phase's KV
        # slots are then one numpy op, not one per request.
        table, rows = page_table(reqs), np.array([r.req_idx for r in reqs], dtype=np.int64)
        drafts = self._draft(reqs, rows, table, committed, eager)
        predicted = verify(
            self.target, self.tree, reqs, (rows, table, committed), drafts, self.page_size, eager
        )
        acc = self.tree.accept(drafts, predicted)
        move_path(self.target_kv, self.tree, table, committed, acc, self.page_size)
        new = []
        for r, d, b, a, t in zip(reqs, drafts, acc.branch, acc.length, acc.bonus, strict=True):
            budget = r.max_new_tokens - len(r.output)
            new.append([*d[b, :a].tolist(), int(t)][:budget])
        self.stats.count(acc.length)
        live = [i for i, r in enumerate(reqs) if len(r.output) + len(new[i]) < r.max_new_tokens]
        if live:
            picked = ([reqs[i] for i in live], rows[live], table[live])
            self._extend(*picked, committed[live], [new[i] for i in live], eager)
        return new

    def _draft(
        self, reqs: Sequence[Any], rows: np.ndarray, table: np.ndarray, committed: np.ndarray, eager: bool
    ) -> np.ndarray:
        """``[bs, topk, num_steps]``: each branch's first guess, then its greedy continuation."""
        first = np.array([r.spec.draft_tokens for r in reqs])  # [bs, topk]
        steps, k = self.geometry.draft_forwards, self.geometry.topk
        if steps == 0:
            return first[:, :, None]
        # NOTE: branch j's step i writes the slot of position m + j * stride + i: the request's
        # own pages past its committed tokens (a chain's are its real positions m .. m+steps-1).
        offsets = (np.arange(k)[:, None] * self.branch_stride + np.arange(steps)).reshape(-1)
        batch = Batch.create(
            ForwardMode.DRAFT_DECODE,
            input_ids=first.reshape(-1),
            seq_lens=committed + 1,
            req_pool_indices=rows,
            out_cache_loc=slots_at(
                table, np.arange(len(reqs))[:, None], committed[:, None] + offsets, self.page_size
            ).reshape(-1),
            q_lens=np.full(len(reqs), k),
        )
        rest = self.draft.run(batch, eager=eager).cpu().numpy().reshape(len(reqs), k, steps)
        return np.concatenate([first[:, :, None], rest], axis=2)

    def _extend(
        self,
        reqs: Sequence[Any],
        rows: np.ndarray,
        table: np.ndarray,
        committed: np.ndarray,
        new: Sequence[list[int]],
        eager: bool,
    ) -> None:
        q = np.array([len(t) for t in new])
        owner = np.repeat(np.arange(len(reqs)), q)  # the request of each new token, in order
        pos = np.repeat(committed, q) + np.arange(int(q.sum())) - np.repeat(np.cumsum(q) - q, q)
        batch = Batch.create(
            ForwardMode.DRAFT_EXTEND,
            input_ids=np.concatenate(new),
            seq_lens=committed + q,
            req_pool_indices=rows,
            out_cache_loc=slots_at(table, owner, pos, self.page_size),
            q_lens=q,
        )
        logits = self.draft.run(batch, eager=eager)
        self._set_guesses(reqs, logits[np.cumsum(q) - 1])

    def _set_guesses(self, reqs: Sequence[Any], logits: torch.Tensor) -> None:
        """Each request's ``topk`` best next tokens by draft score (argmax for a chain)."""
        k = self.geometry.topk
        best = logits.argmax(dim=-1, keepdim=True) if k == 1 else logits.topk(k, dim=-1).indices
        for r, row in zip(reqs, best.tolist(), strict=True):
            r.spec.draft_tokens = tuple(row)  # NOTE: tolist() gives Python ints already
