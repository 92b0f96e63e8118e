"""The sparse-MLA backend contract and the torch reference.

A sparse-MLA backend attends each query token over the ``index_topk`` KV slots its indexer
chose (``topk_slots``, −1 = no key), in the absorbed MQA form FlashMLA uses: one shared
latent row ``[576]`` per token is both the key and (its first 512 values) the value.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch

from graphrt.attention.base import Backend, BufferGroup, GraphSupport
from graphrt.kv.mla import KV_LORA_RANK, MLAKVCache
from graphrt.metadata.base import StepMetadata
from graphrt.metadata.sparse import SparseBuffers, sparse_specs


class SparseMLABackend(Protocol):
    """Sparse MLA over an :class:`MLAKVCache`.

    ``buffers()`` is its ``sparse`` group (:func:`~graphrt.metadata.sparse.sparse_specs` sized
    for its heads and slot multiple). ``plan`` runs once per forward before the first layer
    (inside the graph on the graph path) and returns what every layer's ``forward`` needs. ``forward`` takes
    ``q [num_tokens, num_heads, 576]`` and returns ``[num_tokens, num_heads, 512]`` in
    ``q``'s dtype. ``padded_heads``: heads the kernel runs (0 when it runs the model's own);
    ``slot_multiple``: the ``topk_slots`` width the kernel needs a multiple of.
    """

    name: str
    graph_support: GraphSupport
    padded_heads: int
    slot_multiple: int

    def buffers(self) -> BufferGroup: ...

    def plan(self, meta: StepMetadata, sparse: SparseBuffers) -> Any: ...

    def forward(
        self,
        q: torch.Tensor,
        cache: MLAKVCache,
        layer: int,
        sparse: SparseBuffers,
        meta: StepMetadata,
        plan: Any,
        scale: float,
    ) -> torch.Tensor: ...

    def host_scalars(self) -> dict[str, Any]: ...


def sparse_attention(
    q: torch.Tensor, kv: torch.Tensor, valid: torch.Tensor, scale: float, d_v: int = KV_LORA_RANK
) -> torch.Tensor:
    """Dense attention of each token over its selected keys, float32.

    ``q [T, H, D]``, ``kv [T, topk, D]`` (the selected latent rows), ``valid [T, topk]`` bool.
    Values are ``kv[..., :d_v]``. A token with no valid key gets zeros (as FlashMLA does).
    Returns ``[T, H, d_v]`` float32.
    """
    scores = torch.einsum("thd,tkd->thk", q.float(), kv) * scale
    scores = scores.masked_fill(~valid[:, None, :], float("-inf"))
    probs = torch.nan_to_num(scores.softmax(dim=-1), nan=0.0)
    # NOTE: zero invalid values too, so a NaN in a never-selected slot cannot leak as 0 * NaN.
    v = kv[..., :d_v].masked_fill(~valid[:, :, None], 0.0)
    return torch.einsum("thk,tkd->thd", probs, v)


class SparseMLAReference(Backend):
    """Gather the selected slots (dequantised for fp8), then :func:`sparse_attention`."""

    name = "reference"
    padded_heads = 0
    slot_multiple = 1

    def __init__(self, num_heads: int, layout: str, index_topk: int) -> None:
        self.num_heads, self.layout, self.index_topk = num_heads, layout, index_topk

    def buffers(self) -> BufferGroup:
        return BufferGroup(
            sparse_specs(self.index_topk, self.padded_heads, self.slot_multiple), SparseBuffers
        )

    def forward(
        self,
        q: torch.Tensor,
        cache: MLAKVCache,
        layer: int,
        sparse: SparseBuffers,
        meta: StepMetadata,
        plan: Any,
        scale: float,
    ) -> torch.Tensor:
        slots = sparse.topk_slots[: q.shape[0]]
        kv = cache.gather(layer, slots.long().clamp_min(0))
        return sparse_attention(q, kv, slots >= 0, scale).to(q.dtype)
