"""Builders for sparse-MLA tests: a filled MLA cache (inputs come from graphrt.tools.bench.mla_inputs)."""

from __future__ import annotations

import torch

from graphrt.kv.mla import QK_DIM, MLAKVCache, MLAShape
from graphrt.tools.bench.mla_inputs import decode_meta, random_slots, sparse_for

__all__ = ["decode_meta", "filled_cache", "random_slots", "sparse_for"]


def filled_cache(layout: str, device: torch.device, num_pages: int = 9, page_size: int = 16) -> MLAKVCache:
    """An MLA cache whose every live slot holds a random latent row (seeded)."""
    cache = MLAKVCache(MLAShape(1, page_size, num_pages, 8, 64, 4), layout, torch.float32, device)
    gen = torch.Generator().manual_seed(1)
    n = cache.num_live_slots
    rows = torch.randn(n, QK_DIM, generator=gen).to(device)
    cache.store_latent(0, torch.arange(n, device=device), rows)
    return cache
