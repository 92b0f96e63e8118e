"""Attention kinds: what the KV-cache type decides — which backends fit, and the ``ctx``.

The runtime asks its kind for a backend and for the context its models receive, and stays the
same for every kind: MHA/GQA over a :class:`PagedKVCache` (``ctx.attention``), dense MLA
(DeepSeek-V2/V3) over a :class:`LatentKVCache` (``ctx.mla``), or sparse MLA (DSA) over an
:class:`MLAKVCache` (``ctx.index_topk`` + ``ctx.sparse_mla``). The backend owns its buffer
group and plan (:mod:`graphrt.attention.base`).
"""

from __future__ import annotations

from typing import Any, Protocol

import torch

from graphrt.attention.capabilities import Needs
from graphrt.attention.context import ContextInputs, ForwardContext, attach_model_inputs
from graphrt.attention.mla_context import MLAContext
from graphrt.attention.registry import select_backend
from graphrt.attention.sparse_context import SparseMLAContext
from graphrt.kv import LatentKVCache, MLAKVCache


class AttentionKind(Protocol):
    name: str

    def select_backend(self, name: str | None, device: torch.device, needs: Needs | None = None) -> Any:
        """The named backend (or the preferred available one serving ``needs``), built for this
        kind's cache; refused, naming both, when the named one cannot serve ``needs``."""
        ...

    def context(self, inputs: ContextInputs) -> Any:
        """The ``ctx`` the model's forward receives."""
        ...


class MHAKind:
    """MHA/GQA over a paged cache of ``dtype`` (FA3 takes bf16/fp16 only: fp32 runs the reference)."""

    name = "mha"

    def __init__(self, dtype: torch.dtype) -> None:
        self.dtype = dtype

    def select_backend(self, name: str | None, device: torch.device, needs: Needs | None = None) -> Any:
        return select_backend(name, device, self.name, needs, dtype=self.dtype)

    def context(self, inputs: ContextInputs) -> ForwardContext:
        return ForwardContext.from_inputs(inputs)


class MLAKind:
    """Dense MLA over a :class:`LatentKVCache`: backends for its dtype and widths (FA3 takes
    bf16/fp16 with RoPE 64 + latent 512 on Hopper; anything else runs the reference)."""

    name = "mla"

    def __init__(self, kv: LatentKVCache) -> None:
        self.kv = kv

    def select_backend(self, name: str | None, device: torch.device, needs: Needs | None = None) -> Any:
        shape = self.kv.shape
        need = {"dtype": self.kv.dtype, "rope_dim": shape.rope_dim, "kv_lora_rank": shape.kv_lora_rank}
        return select_backend(name, device, self.name, needs, **need)

    def context(self, inputs: ContextInputs) -> MLAContext:
        return MLAContext.from_inputs(inputs)


class SparseMLAKind:
    """DSA over an :class:`MLAKVCache`: backends sized for its layout, heads and ``index_topk``."""

    name = "sparse_mla"

    def __init__(self, kv: MLAKVCache) -> None:
        self.kv = kv

    def select_backend(self, name: str | None, device: torch.device, needs: Needs | None = None) -> Any:
        kv = self.kv
        need = {"layout": kv.layout, "num_heads": kv.shape.num_heads, "index_topk": kv.index_topk}
        return select_backend(name, device, self.name, needs, **need)

    def context(self, inputs: ContextInputs) -> SparseMLAContext:
        # NOTE: DSA presets have neither sliding windows nor chunked-local layers.
        assert inputs.local is None, "chunked-local attention is an MHA feature"
        ctx = SparseMLAContext(inputs.meta, inputs.kv, inputs.backend, inputs.group, inputs.req_to_token)
        return attach_model_inputs(ctx, inputs)


def attention_kind(kv: Any) -> AttentionKind:
    """The kind a KV cache implies (MHA/GQA for a :class:`~graphrt.kv.PagedKVCache`)."""
    if isinstance(kv, LatentKVCache):
        return MLAKind(kv)
    return SparseMLAKind(kv) if isinstance(kv, MLAKVCache) else MHAKind(kv.dtype)
