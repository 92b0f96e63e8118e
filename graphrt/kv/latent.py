"""Dense-MLA KV cache: per token the compressed latent ``c_kv`` and the shared RoPE key.

DeepSeek-V2/V3-style multi-head latent attention caches, per layer and per token, the
kv_lora_rank-wide latent (the normed ``kv_a`` output) and the qk_rope_head_dim-wide RoPE key
shared by every head. They live in two tensors per layer, each shaped as a one-head paged
cache, so FA3 reads them as ``k_cache`` (RoPE key) and ``v_cache`` (latent) with ``qv`` (the
absorbed ``q_nope``) scoring against the latent. As in
:class:`~graphrt.kv.PagedKVCache`, the last page is the dummy page and its first slot the dummy slot.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from graphrt.kv.paged import KV_DTYPES, PagedSlots


@dataclass(frozen=True, slots=True)
class LatentShape:
    """Geometry of a dense-MLA cache: layers, latent and RoPE widths, pages."""

    num_layers: int
    kv_lora_rank: int
    rope_dim: int
    page_size: int
    num_pages: int  # including the reserved dummy page


class LatentKVCache(PagedSlots):
    """Per-layer ``rope [num_pages, page_size, 1, rope_dim]`` and ``latent [num_pages,
    page_size, 1, kv_lora_rank]`` caches of ``dtype``.

    Parameters
    ----------
    shape : LatentShape
    dtype : torch.dtype
        bf16 / fp16 (what FA3 reads) or fp32 (the reference backend).
    device : torch.device
    """

    def __init__(self, shape: LatentShape, dtype: torch.dtype, device: torch.device) -> None:
        if dtype not in KV_DTYPES:
            raise TypeError(f"KV dtype must be one of {KV_DTYPES}, got {dtype}")
        if shape.num_pages < 2:
            raise ValueError(f"num_pages must be >= 2 (one is the dummy), got {shape.num_pages}")
        self.shape, self.dtype, self.device = shape, dtype, device
        pages = (shape.num_pages, shape.page_size, 1)
        self.rope = [
            torch.zeros(*pages, shape.rope_dim, dtype=dtype, device=device) for _ in range(shape.num_layers)
        ]
        self.latent = [
            torch.zeros(*pages, shape.kv_lora_rank, dtype=dtype, device=device)
            for _ in range(shape.num_layers)
        ]

    @property
    def bytes_per_token(self) -> int:
        """Cache bytes per token per layer: ``(kv_lora_rank + rope_dim) * itemsize``."""
        return (self.shape.kv_lora_rank + self.shape.rope_dim) * self.rope[0].element_size()

    def slot_rows(self) -> list[torch.Tensor]:
        """Every per-slot tensor as ``[num_slots, width]`` (views)."""
        return [t.view(-1, t.shape[-1]) for t in (*self.rope, *self.latent)]

    def store(self, layer: int, loc: torch.Tensor, rope: torch.Tensor, latent: torch.Tensor) -> None:
        """Write ``rope [n, rope_dim]`` and ``latent [n, kv_lora_rank]`` at slots ``loc`` (int64)."""
        for cache, x in ((self.rope[layer], rope), (self.latent[layer], latent)):
            cache.view(-1, cache.shape[-1]).index_copy_(0, loc, x.reshape(-1, cache.shape[-1]).to(self.dtype))
