"""Attention kinds: what the KV-cache type decides — backend, extra static buffers, context.

The runtime asks its kind for these three things and stays the same for every kind:
MHA/GQA over a :class:`PagedKVCache` (``ctx.attention``), or sparse MLA (DSA) over an
:class:`MLAKVCache` (``ctx.index_topk`` + ``ctx.sparse_mla``).
"""

from __future__ import annotations

from typing import Any, Protocol

import torch

from graphrt.attention.context import ContextInputs, ForwardContext
from graphrt.attention.registry import select_backend
from graphrt.attention.sparse_context import SparseMLAContext
from graphrt.buffers import Dims, StaticBuffers
from graphrt.kv import MLAKVCache
from graphrt.metadata.sparse import SparseBuffers, sparse_specs


class AttentionKind(Protocol):
    name: str

    def select_backend(self, name: str | None, device: torch.device) -> Any: ...

    def static_buffers(self, dims: Dims, device: torch.device) -> StaticBuffers | None:
        """The kind's own buffer family (allocated once, viewed per bucket), if any."""
        ...

    def context(self, inputs: ContextInputs) -> Any:
        """The ``ctx`` the model's forward receives."""
        ...


class MHAKind:
    """MHA/GQA over a paged cache of ``dtype`` (FA3 takes bf16/fp16 only: fp32 runs the reference)."""

    name = "mha"

    def __init__(self, dtype: torch.dtype) -> None:
        self.dtype = dtype

    def select_backend(self, name: str | None, device: torch.device) -> Any:
        return select_backend(name, device, self.name, dtype=self.dtype)

    def static_buffers(self, dims: Dims, device: torch.device) -> None:
        return None

    def context(self, inputs: ContextInputs) -> ForwardContext:
        return ForwardContext.from_inputs(inputs)


class SparseMLAKind:
    """DSA: the ``sparse`` buffer family sized for the cache's ``index_topk`` and heads."""

    name = "sparse_mla"

    def __init__(self, kv: MLAKVCache) -> None:
        self.kv = kv
        self.specs: tuple = ()

    def select_backend(self, name: str | None, device: torch.device) -> Any:
        backend = select_backend(
            name, device, self.name, layout=self.kv.layout, num_heads=self.kv.shape.num_heads
        )
        self.specs = sparse_specs(self.kv.index_topk, backend.padded_heads, backend.slot_multiple)
        return backend

    def static_buffers(self, dims: Dims, device: torch.device) -> StaticBuffers:
        return StaticBuffers("sparse", self.specs, SparseBuffers, dims, device)

    def context(self, inputs: ContextInputs) -> SparseMLAContext:
        # NOTE: DSA presets have neither sliding windows nor chunked-local layers.
        assert inputs.local is None, "chunked-local attention is an MHA feature"
        return SparseMLAContext(inputs.meta, inputs.kv, inputs.backend, inputs.extra, inputs.req_to_token)


def attention_kind(kv: Any) -> AttentionKind:
    """The kind a KV cache implies."""
    return SparseMLAKind(kv) if isinstance(kv, MLAKVCache) else MHAKind(kv.dtype)
