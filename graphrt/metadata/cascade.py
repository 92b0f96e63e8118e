"""Cascade metadata for token trees (``topk > 1``): a shared prefix plus a per-token expand part.

A tree query token attends (1) its request's committed prefix, non-causally, through the
normal page table, and (2) its own ancestors inside the tree ("expand"), each query token
a request of its own whose "pages" are single KV slots listed by the mask. The two partial
results are merged with their log-sum-exps (``merge_state``). TARGET_VERIFY takes the
expand lists from ``Batch.tree_mask`` (host); DRAFT_DECODE step ``i`` takes them from the
branch's own draft slots ``0..i`` (device, inside the graph).
"""

from __future__ import annotations

import numpy as np
import torch

from graphrt.buffers import BufferSpec, PadRule
from graphrt.metadata.base import CascadeBuffers
from graphrt.metadata.groups import GroupRow, Stateless
from graphrt.step.batch import Batch
from graphrt.step.modes import MODES, TreeInput


def cascade_specs(width: int) -> tuple[BufferSpec, ...]:
    """The cascade group for expand lists of up to ``width`` slots per query token."""
    return (
        BufferSpec(
            "expand_table", ("max_tokens", width), torch.int32, PadRule("const", "dummy_slot"), host=True
        ),
        BufferSpec("expand_seqlens", ("max_tokens",), torch.int32, PadRule("const", 1), host=True),
        BufferSpec("expand_cu_seqlens_q", ("max_tokens+1",), torch.int32, PadRule("step", 1), host=True),
        BufferSpec("prefix_seqlens", ("max_bs",), torch.int32, PadRule("const", "pad_prefix_len")),
    )


def chain_tree_mask(num_steps: int, topk: int, num_draft_tokens: int | None = None) -> np.ndarray:
    """Ancestor-or-self mask ``[n, n]`` of a root with ``topk`` chains of ``num_steps`` drafts.

    Tokens are branch-major (root, chain 0, chain 1, …); cutting to ``num_draft_tokens`` keeps
    it ancestor-closed. This is the tree DRAFT_DECODE with ``topk > 1`` produces.
    """
    full = 1 + topk * num_steps
    n = full if num_draft_tokens is None else num_draft_tokens
    parent = [-1] + [0 if (k - 1) % num_steps == 0 else k - 1 for k in range(1, full)]
    mask = np.zeros((n, n), dtype=bool)
    for k in range(n):
        p = k
        while p >= 0:
            mask[k, p], p = True, parent[p]
    return mask


def write_tree_host(batch: Batch, host: dict[str, np.ndarray], tokens: int, dummy_slot: int) -> None:
    """Expand lists of a TARGET_VERIFY tree: token ``i`` reads the slots of its ancestors.

    Every element of ``[:tokens]`` is written (pad tokens: the dummy slot, length 1).
    """
    n = batch.num_tokens
    table, lens = host["expand_table"], host["expand_seqlens"]
    table[:tokens] = dummy_slot
    lens[n:tokens] = 1
    host["expand_cu_seqlens_q"][: tokens + 1] = np.arange(tokens + 1)
    if not n:
        return
    mask = batch.tree_mask
    assert mask is not None, "a tree step needs Batch.tree_mask"
    bs, q = mask.shape[:2]
    slots = batch.out_cache_loc.reshape(bs, 1, q)
    # NOTE: a stable sort puts each token's ancestors first, in tree order, then the rest.
    order = np.argsort(~mask, axis=2, kind="stable")
    listed = np.take_along_axis(np.broadcast_to(slots, mask.shape), order, axis=2)
    count = mask.sum(axis=2).reshape(-1)
    listed = np.where(np.arange(q) < count.reshape(bs, q, 1), listed, dummy_slot)
    table[:n, :q] = listed.reshape(n, q)
    lens[:n] = count


def derive_prefix(cascade: CascadeBuffers, cache_seqlens: torch.Tensor, tree_tokens: int) -> None:
    """``prefix_seqlens = cache_seqlens - tree_tokens`` (device, inside the graph)."""
    torch.sub(cache_seqlens, tree_tokens, out=cascade.prefix_seqlens)


def draft_step_cascade(cascade: CascadeBuffers, draft_loc: torch.Tensor, step: int) -> CascadeBuffers:
    """Expand metadata of DRAFT_DECODE step ``step``: each branch reads its slots ``0..step``.

    Derived inside the graph from the static ``draft_loc [T, steps]``; the result lives in
    the graph's pool like any activation and is rebuilt on every replay.
    """
    width = step + 1
    table = draft_loc[:, :width].to(torch.int32).contiguous()
    lens = torch.full_like(cascade.expand_seqlens[: table.shape[0]], width)
    return CascadeBuffers(
        table, lens, cascade.expand_cu_seqlens_q[: table.shape[0] + 1], cascade.prefix_seqlens
    )


def write_cascade_host(batch: Batch, host: dict[str, np.ndarray], tokens: int, dummy_slot: int) -> None:
    """The host half of the cascade group for ``batch``'s mode (see :class:`TreeInput`)."""
    if MODES[batch.mode].tree is TreeInput.MASK:
        write_tree_host(batch, host, tokens, dummy_slot)
        return
    # NOTE: DRAFT_DECODE derives its expand lists per step inside the graph; only the
    # one-query-per-token offsets are read from here.
    host["expand_table"][:tokens] = dummy_slot
    host["expand_seqlens"][:tokens] = 1
    host["expand_cu_seqlens_q"][: tokens + 1] = np.arange(tokens + 1)


#: Exists for token trees (``topk > 1``); used by the modes whose queries form a tree.
CASCADE_GROUP = GroupRow(
    "cascade",
    lambda g, dims: cascade_specs(max(g.spec.num_draft_tokens, g.spec.draft_forwards)),
    lambda g: CascadeBuffers,
    exists=lambda g: g.tree,
    used_by=lambda mode, g: MODES[mode].tree is not TreeInput.NONE,
    writer=lambda g, dims, device: Stateless(write_cascade_host),
)
