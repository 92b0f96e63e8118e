"""Draft trees for one verify: node layout, greedy path acceptance, the KV moves of the path.

A round's draft for one request is ``drafts [topk, num_steps]``: branch ``j`` starts with the
draft's ``j``-th best guess for the next position and continues greedily (the tree one
DRAFT_DECODE graph produces, see ``chain_tree_mask``). Branches are ranked by the draft's
score of their first token, so cutting the tree to ``num_draft_tokens`` nodes branch-major
keeps the likeliest branch whole. A chain is the tree with ``topk == 1``.

Verify node ``0`` is the pending token; node ``1 + j * num_steps + d`` is branch ``j`` at
depth ``d + 1``. Node ``k`` writes its KV at the slot of position ``m - 1 + k``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from graphrt.metadata.cascade import chain_tree_mask
from graphrt.step.modes import SpecGeometry


@dataclass(frozen=True, slots=True)
class Accepted:
    """Per request of one verify: the branch taken, drafts accepted on it, the bonus token."""

    branch: np.ndarray  # [bs] int64
    length: np.ndarray  # [bs] int64, accepted drafts (0 .. max_depth)
    bonus: np.ndarray  # [bs] int64, the target's token after the accepted path


@dataclass(frozen=True, slots=True)
class TreeLayout:
    """Where each draft sits among the verify's ``num_nodes`` query tokens."""

    num_steps: int
    topk: int
    num_nodes: int

    @classmethod
    def of(cls, geometry: SpecGeometry) -> TreeLayout:
        return cls(geometry.num_steps, geometry.topk, geometry.num_draft_tokens)

    @property
    def max_depth(self) -> int:
        """Most drafts one verify can accept (the longest kept branch)."""
        return min(self.num_steps, self.num_nodes - 1)

    def node(self, branch: np.ndarray, depth: np.ndarray) -> np.ndarray:
        """Node index of ``branch`` at 0-based ``depth`` (broadcasting)."""
        return 1 + branch * self.num_steps + depth

    def mask(self, bs: int) -> np.ndarray | None:
        """``Batch.tree_mask [bs, n, n]``; None for a chain (a causal verify)."""
        if self.topk == 1:
            return None
        tree = chain_tree_mask(self.num_steps, self.topk, self.num_nodes)
        return np.broadcast_to(tree, (bs, self.num_nodes, self.num_nodes)).copy()

    def tokens(self, pending: np.ndarray, drafts: np.ndarray) -> np.ndarray:
        """Verify input ids ``[bs, n]`` from ``pending [bs]`` and ``drafts [bs, topk, steps]``."""
        flat = np.concatenate([pending[:, None], drafts.reshape(len(pending), -1)], axis=1)
        return flat[:, : self.num_nodes]

    def accept(self, drafts: np.ndarray, predicted: np.ndarray, valid: np.ndarray | None = None) -> Accepted:
        """Matching down the tree: the longest path whose every draft is the target's token.

        ``drafts [bs, topk, steps]``; ``predicted [bs, n]``: the target's token after each node
        (its argmax, or its draw for a sampled request: see :mod:`graphrt.runtime.verify_sampler`).
        ``valid [bs, topk, steps]`` bool: the drafts actually proposed (pads never match).
        Branches hold distinct first tokens, so at most one branch matches at depth 1.
        """
        bs = len(drafts)
        depth = np.arange(self.num_steps)
        nodes = self.node(np.arange(self.topk)[:, None], depth[None, :])  # [topk, steps]
        parents = np.where(depth == 0, 0, nodes - 1)
        kept = nodes < self.num_nodes
        after = predicted[:, np.minimum(parents, self.num_nodes - 1)]  # [bs, topk, steps]
        match = kept & (drafts == after)
        if valid is not None:
            match &= valid
        count = np.cumprod(match, axis=2).sum(axis=2)  # [bs, topk]
        branch = np.argmax(count, axis=1)
        length = count[np.arange(bs), branch]
        last = np.where(length > 0, self.node(branch, length - 1), 0)
        return Accepted(branch, length, predicted[np.arange(bs), last])

    def moves(self, accepted: Accepted) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(request, src node, dst node)`` of every accepted draft not already in place.

        Accepted draft ``d`` of a path sits at node ``node(branch, d)`` and belongs at node
        ``d + 1`` (position ``m + d``); branch 0 is already in place.
        """
        req = np.repeat(np.arange(len(accepted.length)), accepted.length)
        depth = np.arange(req.size) - np.repeat(np.cumsum(accepted.length) - accepted.length, accepted.length)
        src = self.node(accepted.branch[req], depth)
        keep = src != depth + 1
        return req[keep], src[keep], (depth + 1)[keep]
