"""The object a model's forward receives: it stores K/V and runs attention for one step."""

from __future__ import annotations

from typing import Any

import torch

from graphrt.attention.base import AttentionBackend
from graphrt.kv_cache import PagedKVCache
from graphrt.local_attention import LocalStep, local_metadata
from graphrt.metadata import StepMetadata


class ForwardContext:
    """Per-step handle passed as ``ctx`` to ``forward(input_ids, positions, ctx)``.

    ``local``: the step's chunked-local virtual batch, when the runtime has one.
    ``layer_scalars``: where per-layer kernel scalars (window, chunk) are recorded.
    """

    def __init__(
        self,
        meta: StepMetadata,
        kv: PagedKVCache,
        backend: AttentionBackend,
        local: LocalStep | None = None,
        layer_scalars: dict[str, Any] | None = None,
    ) -> None:
        self.meta, self.kv, self.backend, self.local = meta, kv, backend, local
        self.layer_scalars = {} if layer_scalars is None else layer_scalars

    @property
    def mode(self):
        """The step's :class:`~graphrt.modes.ForwardMode`."""
        return self.meta.mode

    def attention(
        self,
        layer_id: int,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        *,
        window: int | None = None,
        chunk: int | None = None,
    ) -> torch.Tensor:
        """Store ``k``/``v`` at ``out_cache_loc``, then attend.

        ``q [num_tokens, num_q_heads, head_dim]``, ``k``/``v [num_tokens, num_kv_heads,
        head_dim]``; returns ``[num_tokens, num_q_heads, head_dim]``. ``window``: a query at
        position ``p`` sees keys ``p - window … p`` (sliding window); ``chunk``: it sees keys
        from ``p - p % chunk`` on (chunked-local attention). Both are fixed per layer.
        """
        self.kv.store(layer_id, self.meta.buffers.out_cache_loc, k, v)
        scale = q.shape[-1] ** -0.5
        meta, extra = self.meta, {}
        if window is not None:
            if self.meta.cascade is not None:
                raise ValueError(
                    f"layer {layer_id}: sliding window {window} with a token tree (topk > 1) is not supported"
                )
            self.layer_scalars[f"layer{layer_id}.window"] = window
            extra["window"] = window
        if chunk is not None:
            meta = local_metadata(self.local, layer_id, chunk)
            self.layer_scalars[f"layer{layer_id}.chunk"] = chunk
            self.layer_scalars["local.max_seqlen_q"] = meta.max_seqlen_q
        return self.backend.forward(q, self.kv.k[layer_id], self.kv.v[layer_id], meta, scale, **extra)
