"""The sparse-MLA torch reference, and what a sparse-MLA backend computes.

A sparse-MLA backend (the one contract of :mod:`graphrt.attention.base`) attends each query token over the ``index_topk`` KV slots its indexer
chose (``topk_slots``, −1 = no key), in the absorbed MQA form FlashMLA uses: one shared
latent row ``[576]`` per token is both the key and (its first 512 values) the value. Its
:class:`~graphrt.attention.call.AttendCall` carries ``q [num_tokens, num_heads, 576]``, the
layer's latent cache as ``k_cache`` (and ``v_cache``) and its ``sparse`` group
(:func:`~graphrt.metadata.sparse.sparse_specs`, sized by the backend's ``padded_heads`` and
``slot_multiple``) as ``group``; ``forward`` returns ``[num_tokens, num_heads, 512]`` in ``q``'s
dtype.
"""

from __future__ import annotations

import torch

from graphrt.attention.base import Backend, BufferGroup
from graphrt.attention.call import AttendCall
from graphrt.attention.capabilities import REQUEST_MODES, GraphSupport
from graphrt.kv.mla import KV_LORA_RANK, dequantize_fp8
from graphrt.metadata.sparse import SparseBuffers, sparse_specs


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
    graph_support = GraphSupport(REQUEST_MODES, trees=True, fp8_kv=True)
    padded_heads = 0
    slot_multiple = 1

    def __init__(self, num_heads: int, layout: str, index_topk: int) -> None:
        self.num_heads, self.layout, self.index_topk = num_heads, layout, index_topk

    def buffers(self) -> BufferGroup:
        return BufferGroup(
            sparse_specs(self.index_topk, self.padded_heads, self.slot_multiple), SparseBuffers
        )

    def forward(self, call: AttendCall) -> torch.Tensor:
        q, sparse = call.q, call.group
        slots = sparse.topk_slots[: q.shape[0]]
        rows = call.k_cache.view(-1, call.k_cache.shape[-1])[slots.long().clamp_min(0)]
        kv = dequantize_fp8(rows) if self.layout == "fp8" else rows.float()
        return sparse_attention(q, kv, slots >= 0, call.scale).to(q.dtype)
