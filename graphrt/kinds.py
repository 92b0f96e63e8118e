"""Attention kinds: what the KV-cache type decides — backend, extra static buffers, context.

The runtime asks its kind for these three things and stays the same for every kind:
MHA/GQA over a :class:`PagedKVCache` (``ctx.attention``), or sparse MLA (DSA) over an
:class:`MLAKVCache` (``ctx.index_topk`` + ``ctx.sparse_mla``).
"""

from __future__ import annotations

from typing import Any, Protocol

import torch

from graphrt.attention import (
    flashmla,  # noqa: F401  (registers the FlashMLA sparse backends)
    select_backend,
)
from graphrt.attention.mla import select_sparse_backend
from graphrt.buffers import Dims, StaticBuffers
from graphrt.context import ForwardContext
from graphrt.kv_cache import PagedKVCache, ReqToToken
from graphrt.metadata import StepMetadata
from graphrt.mla_cache import MLAKVCache
from graphrt.sparse_context import SparseMLAContext
from graphrt.sparse_metadata import SparseBuffers, sparse_specs


class AttentionKind(Protocol):
    name: str

    def select_backend(self, name: str | None, device: torch.device) -> Any: ...

    def static_buffers(self, dims: Dims, device: torch.device) -> StaticBuffers | None:
        """The kind's own buffer family (allocated once, viewed per bucket), if any."""
        ...

    def context(
        self,
        meta: StepMetadata,
        kv: Any,
        backend: Any,
        r2t: ReqToToken,
        extra: Any,
        local: Any,
        layer_scalars: dict,
    ) -> Any:
        """The ``ctx`` the model's forward receives (``local``: chunked-local step, MHA only)."""
        ...


class MHAKind:
    name = "mha"

    def select_backend(self, name: str | None, device: torch.device) -> Any:
        return select_backend(name, device)

    def static_buffers(self, dims: Dims, device: torch.device) -> None:
        return None

    def context(
        self,
        meta: StepMetadata,
        kv: PagedKVCache,
        backend: Any,
        r2t: ReqToToken,
        extra: None,
        local: Any,
        layer_scalars: dict,
    ) -> ForwardContext:
        return ForwardContext(meta, kv, backend, local, layer_scalars)


class SparseMLAKind:
    """DSA: the ``sparse`` buffer family sized for the cache's ``index_topk`` and heads."""

    name = "sparse_mla"

    def __init__(self, kv: MLAKVCache) -> None:
        self.kv = kv
        self.specs: tuple = ()

    def select_backend(self, name: str | None, device: torch.device) -> Any:
        backend = select_sparse_backend(name, device, self.kv.layout, self.kv.shape.num_heads)
        self.specs = sparse_specs(self.kv.index_topk, backend.padded_heads, backend.slot_multiple)
        return backend

    def static_buffers(self, dims: Dims, device: torch.device) -> StaticBuffers:
        return StaticBuffers("sparse", self.specs, SparseBuffers, dims, device)

    def context(
        self,
        meta: StepMetadata,
        kv: MLAKVCache,
        backend: Any,
        r2t: ReqToToken,
        extra: SparseBuffers,
        local: Any,
        layer_scalars: dict,
    ) -> SparseMLAContext:
        # NOTE: DSA presets have neither sliding windows nor chunked-local layers.
        assert local is None, "chunked-local attention is an MHA feature"
        return SparseMLAContext(meta, kv, backend, extra, r2t)


def attention_kind(kv: Any) -> AttentionKind:
    """The kind a KV cache implies."""
    return SparseMLAKind(kv) if isinstance(kv, MLAKVCache) else MHAKind()
