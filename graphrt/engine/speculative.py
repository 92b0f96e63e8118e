"""Greedy speculative decoding with a draft model, chain (``topk == 1``) or tree, graph per phase.

One round for the running requests: DRAFT_DECODE (the draft's remaining steps for each of the
``topk`` branches, one graph) → TARGET_VERIFY (the pending token plus the drafts; a tree mask
for ``topk > 1``, one graph) → greedy acceptance down the tree on the host → the accepted
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

from graphrt.engine.batches import prefill_batch
from graphrt.engine.pages import page_table, slots_at
from graphrt.engine.spec_tree import Accepted, TreeLayout
from graphrt.kv.move import move_slots
from graphrt.runtime import GraphRuntime
from graphrt.step.batch import Batch
from graphrt.step.modes import ForwardMode, SpecGeometry

DRAFT_INITS = ("target", "seed", "checkpoint")


@dataclass(frozen=True, slots=True)
class SpecOptions:
    """``Engine(speculative={...})``, validated.

    ``draft_init``: ``"target"`` copies the target's weights by name into a preset draft (early
    exit, or a copy for the same preset); ``"seed"``: the preset's random weights from
    ``draft_seed``; ``"checkpoint"``: the draft checkpoint's own weights. Default: ``"target"``
    for a preset, ``"checkpoint"`` for a checkpoint (resolved by the draft builder).
    """

    draft_model: str
    geometry: SpecGeometry
    draft_seed: int = 1
    draft_init: str | None = None

    @classmethod
    def parse(cls, options: dict[str, Any]) -> SpecOptions:
        known = {"draft_model", "num_steps", "topk", "num_draft_tokens", "draft_seed", "draft_init"}
        unknown = set(options) - known
        if unknown:
            raise ValueError(f"unknown speculative option(s) {sorted(unknown)}; known: {sorted(known)}")
        init = options.get("draft_init")
        if init is not None and init not in DRAFT_INITS:
            raise ValueError(f"draft_init must be one of {DRAFT_INITS}, got {init!r}")
        steps, topk = int(options.get("num_steps", 3)), int(options.get("topk", 1))
        geometry = SpecGeometry(steps, topk, int(options.get("num_draft_tokens", 0)))
        draft = str(options.get("draft_model", "tiny-llama-draft"))
        return cls(draft, geometry, int(options.get("draft_seed", 1)), init)


@dataclass(slots=True)
class SpecState:
    """Per request: the draft's ``topk`` best guesses for the next position, best first."""

    draft_tokens: tuple[int, ...] = ()


@dataclass(slots=True)
class Acceptance:
    """Counts over verifies (one per request per round): depths offered, drafts accepted."""

    verify_steps: int = 0
    proposed: int = 0  # verifies × the deepest path a verify can accept
    accepted: int = 0
    per_position: list[int] = field(default_factory=list)  # verifies accepting depth > i

    @property
    def rate(self) -> float:
        return self.accepted / self.proposed if self.proposed else 0.0

    @property
    def mean_accept_length(self) -> float:
        """Tokens committed per request per verify (accepted drafts + the bonus token)."""
        return (self.accepted / self.verify_steps + 1.0) if self.verify_steps else 0.0

    def count(self, length: np.ndarray) -> None:
        """Add one verify per request, ``length [bs]`` drafts accepted by each."""
        self.verify_steps += length.size
        self.proposed += length.size * len(self.per_position)
        self.accepted += int(length.sum())
        for i in range(len(self.per_position)):
            self.per_position[i] += int((length > i).sum())


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

    def round(self, reqs: Sequence[Any], eager: bool) -> list[list[int]]:
        """One draft → verify → extend round; returns the tokens each request commits."""
        committed = np.array([len(r.prompt) + len(r.output) for r in reqs])
        # NOTE: the pages and rows of the round's requests as arrays, once: every phase's KV
        # slots are then one numpy op, not one per request.
        table, rows = page_table(reqs), np.array([r.req_idx for r in reqs], dtype=np.int64)
        drafts = self._draft(reqs, rows, table, committed, eager)
        predicted = self._verify(reqs, rows, table, committed, drafts, eager)
        acc = self.tree.accept(drafts, predicted)
        self._move_path(table, committed, acc)
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

    def _verify(
        self,
        reqs: Sequence[Any],
        rows: np.ndarray,
        table: np.ndarray,
        committed: np.ndarray,
        drafts: np.ndarray,
        eager: bool,
    ) -> np.ndarray:
        """The target's argmax after every verify node, ``[bs, num_draft_tokens]``."""
        n, bs = self.geometry.num_draft_tokens, len(reqs)
        pending = np.array([r.output[-1] for r in reqs])
        batch = Batch.create(
            ForwardMode.TARGET_VERIFY,
            input_ids=self.tree.tokens(pending, drafts).reshape(-1),
            seq_lens=committed - 1 + n,
            req_pool_indices=rows,
            out_cache_loc=slots_at(
                table, np.arange(bs)[:, None], committed[:, None] - 1 + np.arange(n), self.page_size
            ).reshape(-1),
            q_lens=np.full(bs, n),
            tree_mask=self.tree.mask(bs),
        )
        logits = self.target.run(batch, eager=eager)
        return logits.argmax(dim=-1).cpu().numpy().reshape(bs, n)

    def _move_path(self, table: np.ndarray, committed: np.ndarray, acc: Accepted) -> None:
        """Copy the target KV of each accepted draft from its node's slot to its position's.

        Node ``k`` sits at position ``m - 1 + k``; the next verify reads the path as positions
        ``m .. m + a - 1``. Moves within a request's own slots: its ledger entries stay valid.
        """
        req, src, dst = self.tree.moves(acc)
        if not req.size:
            return
        at = {key: committed[req] - 1 + nodes for key, nodes in (("src", src), ("dst", dst))}
        found = {key: slots_at(table, req, pos, self.page_size) for key, pos in at.items()}
        if any(int(s.min()) < 0 for s in found.values()):
            # NOTE: a position past a request's pages (-1 padded): this move does not pass
            # through run()'s checks, so refuse it here rather than write another page.
            raise RuntimeError("speculative KV move outside a request's pages")
        slots = {key: torch.as_tensor(s, device=self.target_kv.device) for key, s in found.items()}
        move_slots(self.target_kv, slots["src"], slots["dst"])

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
