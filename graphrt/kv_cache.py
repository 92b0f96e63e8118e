"""Paged KV cache for MHA/GQA and the request → KV-slot table, each with a reserved dummy."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from graphrt.kv_ledger import KVLedger

KV_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


@dataclass(frozen=True, slots=True)
class KVShape:
    num_layers: int
    num_kv_heads: int
    head_dim: int
    page_size: int
    num_pages: int  # including the reserved dummy page


class PagedSlots:
    """Page geometry shared by every KV cache: the last page is the reserved dummy page.

    Subclasses set ``self.shape`` with ``page_size`` and ``num_pages`` (dummy included).
    """

    shape: Any

    @property
    def page_size(self) -> int:
        return self.shape.page_size

    @property
    def dummy_page(self) -> int:
        return self.shape.num_pages - 1

    @property
    def dummy_slot(self) -> int:
        return self.dummy_page * self.shape.page_size

    @property
    def num_live_slots(self) -> int:
        """Slots ``0 .. num_live_slots-1`` may hold real tokens."""
        return self.dummy_slot


class PagedKVCache(PagedSlots):
    """Per-layer K and V caches of shape ``[num_pages, page_size, num_kv_heads, head_dim]``.

    The last page is reserved as the dummy page and its first slot as the dummy slot:
    padded rows of a graph read that page and write that slot, never a live one (and never
    slot 0, which belongs to a live page).
    """

    def __init__(self, shape: KVShape, dtype: torch.dtype, device: torch.device) -> None:
        if dtype not in KV_DTYPES:
            raise TypeError(f"KV dtype must be one of {KV_DTYPES}, got {dtype}")
        if shape.num_pages < 2:
            raise ValueError(f"num_pages must be >= 2 (one is the dummy), got {shape.num_pages}")
        self.shape, self.dtype, self.device = shape, dtype, device
        size = (shape.num_pages, shape.page_size, shape.num_kv_heads, shape.head_dim)
        self.k = [torch.zeros(size, dtype=dtype, device=device) for _ in range(shape.num_layers)]
        self.v = [torch.zeros(size, dtype=dtype, device=device) for _ in range(shape.num_layers)]

    def store(self, layer: int, loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Write ``k``/``v`` ``[num_tokens, num_kv_heads, head_dim]`` at slots ``loc`` (int64)."""
        kvh, d = self.shape.num_kv_heads, self.shape.head_dim
        self.k[layer].view(-1, kvh, d).index_copy_(0, loc, k.to(self.dtype))
        self.v[layer].view(-1, kvh, d).index_copy_(0, loc, v.to(self.dtype))


class ReqToToken:
    """``req_to_token [max_reqs + 1, max_context_len]`` int32: KV slot of each request position.

    Row ``max_reqs`` is the dummy request: every entry is the dummy slot, so padded rows
    gather the dummy page. Each step writes its own tokens' slots (``out_cache_loc``) into
    the table before the page table is gathered from it.

    ``ledger`` (host) knows how many positions each row has validly written since it was
    (re)assigned and which row holds each live slot; ``GraphRuntime.run`` checks every step
    against it before writing anything (see :mod:`graphrt.kv_ledger`). A scheduler calls
    :meth:`free` when a request finishes and :meth:`share_prefix` for prefix-cache hits.
    """

    def __init__(
        self,
        max_reqs: int,
        max_context_len: int,
        page_size: int,
        dummy_slot: int,
        device: torch.device,
    ) -> None:
        self.max_reqs, self.max_context_len = max_reqs, max_context_len
        self.table = torch.full((max_reqs + 1, max_context_len), dummy_slot, dtype=torch.int32, device=device)
        # NOTE: column j*page_size of a row holds the first slot of the row's page j.
        self.page_starts = torch.arange(0, max_context_len, page_size, device=device)
        self.ledger = KVLedger(max_reqs, max_context_len, dummy_slot)

    @property
    def dummy_req(self) -> int:
        return self.max_reqs

    @property
    def valid_lens(self) -> np.ndarray:
        """``[max_reqs]`` int64: positions each row has validly written (read-only view)."""
        view = self.ledger.valid_lens.view()
        view.flags.writeable = False
        return view

    def free(self, row: int) -> None:
        """Release ``row`` and its slots: it reads nothing until a step writes it from 0."""
        self._check_row("row", row)
        self.ledger.free(row)

    def share_prefix(self, src: int, dst: int, length: int) -> None:
        """Let row ``dst`` hold row ``src``'s positions ``0..length-1`` (a prefix-cache hit).

        ``dst`` is freed first; the shared slots stay live while either row holds them, and
        neither row may write them again (``dst`` writes its own slots from ``length`` on).
        """
        self._check_row("src", src)
        self._check_row("dst", dst)
        self.ledger.share_prefix(src, dst, length)
        self.table[dst, :length] = self.table[src, :length]

    def _check_row(self, name: str, row: int) -> None:
        if not 0 <= row < self.max_reqs:
            raise ValueError(
                f"{name} {row} out of range [0, {self.max_reqs}) (row {self.max_reqs} is the dummy)"
            )
