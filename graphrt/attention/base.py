"""The MHA/GQA attention-backend contract (selection lives in :mod:`graphrt.attention.registry`)."""

from __future__ import annotations

from typing import Any, Protocol

import torch

from graphrt.metadata.base import StepMetadata


class AttentionBackend(Protocol):
    """Paged attention over the KV cache for one layer.

    ``forward`` takes ``q [num_tokens, num_q_heads, head_dim]`` and the layer's caches
    ``[num_pages, page_size, num_kv_heads, head_dim]`` and returns
    ``[num_tokens, num_q_heads, head_dim]`` in ``q``'s dtype. Query token ``i`` of request
    ``b`` sits at position ``cache_seqlens[b] - q_len_b + i`` and attends causally; with
    ``window`` it sees keys ``position - window … position`` only (FA3 ``window_size=(w, 0)``).
    """

    name: str

    def forward(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        meta: StepMetadata,
        scale: float,
        window: int | None = None,
    ) -> torch.Tensor: ...

    def host_scalars(self) -> dict[str, Any]:
        """Python values this backend hands to its kernels beyond the metadata's."""
        ...
