"""Paged KV cache for MHA/GQA with a reserved dummy page, and the page geometry every cache shares."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

KV_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


@dataclass(frozen=True, slots=True)
class KVShape:
    """Geometry of a paged MHA/GQA KV cache: layers, KV heads, head dim, pages."""

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
