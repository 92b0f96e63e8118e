"""The object a model's forward receives: it stores K/V and runs attention for one step."""

from __future__ import annotations

import torch

from graphrt.attention.base import AttentionBackend
from graphrt.kv_cache import PagedKVCache
from graphrt.metadata import StepMetadata


class ForwardContext:
    """Per-step handle passed as ``ctx`` to ``forward(input_ids, positions, ctx)``."""

    def __init__(self, meta: StepMetadata, kv: PagedKVCache, backend: AttentionBackend) -> None:
        self.meta, self.kv, self.backend = meta, kv, backend

    @property
    def mode(self):
        return self.meta.mode

    def attention(self, layer_id: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Store ``k``/``v`` at ``out_cache_loc``, then attend.

        ``q [num_tokens, num_q_heads, head_dim]``, ``k``/``v [num_tokens, num_kv_heads,
        head_dim]``; returns ``[num_tokens, num_q_heads, head_dim]``.
        """
        self.kv.store(layer_id, self.meta.buffers.out_cache_loc, k, v)
        scale = q.shape[-1] ** -0.5
        return self.backend.forward(q, self.kv.k[layer_id], self.kv.v[layer_id], self.meta, scale)
