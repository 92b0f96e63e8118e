"""Copy KV between slots of one cache: a token tree's accepted path into position order.

A verified tree writes node ``k`` of a request at the slot of position ``m - 1 + k`` (node
order), but the accepted path's ``i``-th token belongs at position ``m - 1 + i``. With pages of
more than one slot, positions cannot be pointed at arbitrary slots (a page-table column is a
whole page), so the path's KV is *copied* to the slots of its positions; ``req_to_token`` and
its ledger keep mapping each position to its own slot and stay valid as they are.
"""

from __future__ import annotations

import torch

from graphrt.kv.latent import LatentKVCache
from graphrt.kv.mla import MLAKVCache
from graphrt.kv.paged import PagedKVCache


def slot_rows(kv: PagedKVCache | LatentKVCache | MLAKVCache) -> list[torch.Tensor]:
    """Every per-slot tensor of ``kv`` viewed as ``[num_slots, ...]`` (views, not copies)."""
    if isinstance(kv, LatentKVCache):
        return kv.slot_rows()
    if isinstance(kv, PagedKVCache):
        return kv.slot_rows()
    return [kv.rows(layer) for layer in range(len(kv.kv))] + list(kv.index_k)


def move_slots(kv: PagedKVCache | LatentKVCache | MLAKVCache, src: torch.Tensor, dst: torch.Tensor) -> None:
    """``kv[dst] = kv[src]`` in every layer (``src``, ``dst`` int64 ``[n]`` on ``kv``'s device).

    Every source is read before any destination is written, so overlapping lists are safe.
    ``dst`` must be distinct. Runs outside any graph: the host calls it between steps.
    """
    if src.numel() == 0:
        return
    for rows in slot_rows(kv):
        rows.index_copy_(0, dst, rows.index_select(0, src))
