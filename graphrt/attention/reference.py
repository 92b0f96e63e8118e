"""The torch reference backend: paged gather plus dense masked attention, in float32.

It runs on any device, inside CUDA graphs and the emulated engine alike (uniform query
lengths take a batched path with no host sync), and is the oracle the kernels are tested
against.
"""

from __future__ import annotations

from typing import Any

import torch

from graphrt.attention.base import register
from graphrt.metadata import StepMetadata


def paged_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    page_table: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """Causal attention of ``q [bs, q_len, hq, d]`` over each request's pages.

    ``page_table [bs, max_pages]`` int32 page ids, ``seq_lens [bs]`` KV lengths including the
    ``q_len`` query tokens, which are the last ``q_len`` positions. Returns ``[bs, q_len, hq, d]``.
    """
    bs, q_len, hq, d = q.shape
    page_size, kvh = k_cache.shape[1], k_cache.shape[2]
    offsets = torch.arange(page_size, device=q.device)
    slots = (page_table.long()[:, :, None] * page_size + offsets).view(bs, -1)
    # NOTE: GQA by grouping query heads (head h reads kv head h // group), no K/V repeat.
    qg = q.float().view(bs, q_len, kvh, hq // kvh, d)
    k = k_cache.view(-1, kvh, d)[slots].float()
    v = v_cache.view(-1, kvh, d)[slots].float()
    keys = torch.arange(slots.shape[1], device=q.device)
    # NOTE: zero V past each sequence so stale or poisoned pages cannot leak NaN through 0 * NaN.
    v = v.masked_fill((keys[None, :] >= seq_lens.long()[:, None])[:, :, None, None], 0.0)
    scores = torch.einsum("bqkgd,blkd->bkgql", qg, k) * scale
    q_pos = seq_lens.long()[:, None] - q_len + torch.arange(q_len, device=q.device)
    allowed = keys[None, None, :] <= q_pos[:, :, None]  # causal, hence also < seq_len
    scores = scores.masked_fill(~allowed[:, None, None], float("-inf"))
    out = torch.einsum("bkgql,blkd->bqkgd", scores.softmax(dim=-1), v).reshape(bs, q_len, hq, d)
    return out.to(q.dtype)


class ReferenceBackend:
    name = "reference"

    def forward(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        meta: StepMetadata,
        scale: float,
    ) -> torch.Tensor:
        b = meta.buffers
        bs, q_len = b.cache_seqlens.shape[0], meta.max_seqlen_q
        if q.shape[0] == bs * q_len:  # uniform: graph-safe batched path
            out = paged_attention(
                q.view(bs, q_len, *q.shape[1:]),
                k_cache,
                v_cache,
                b.page_table,
                b.cache_seqlens,
                scale,
            )
            return out.reshape(q.shape)  # NOTE: einsum output is non-contiguous when q_len > 1
        # NOTE: ragged queries (EXTEND) only run eagerly, so reading the offsets is allowed.
        cu = b.cu_seqlens_q.tolist()
        parts = [
            paged_attention(
                q[cu[i] : cu[i + 1]][None],
                k_cache,
                v_cache,
                b.page_table[i : i + 1],
                b.cache_seqlens[i : i + 1],
                scale,
            )[0]
            for i in range(bs)
        ]
        return torch.cat(parts) if parts else q.new_empty(q.shape)

    def host_scalars(self) -> dict[str, Any]:
        return {}


register("reference", lambda device: True)(ReferenceBackend)
