"""The torch reference backend: paged gather plus dense masked attention, in float32.

It runs on any device, inside CUDA graphs and the emulated engine alike: ragged queries are
padded to ``[bs, max_seqlen_q]`` by index arithmetic on ``cu_seqlens_q`` (no host sync, shapes
from the graph key), and it is the oracle the kernels are tested against.
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
    q_lens: torch.Tensor | None = None,
    window: int | None = None,
) -> torch.Tensor:
    """Causal attention of ``q [bs, max_q, hq, d]`` over each request's pages.

    ``page_table [bs, max_pages]`` int32 page ids, ``seq_lens [bs]`` KV lengths including the
    query tokens, which are the last ``q_lens[b]`` positions (default: all ``max_q``); query
    rows past ``q_lens[b]`` are padding (their output is meaningless and dropped by callers).
    ``window``: a query at position ``p`` sees keys ``p - window … p`` only. Returns
    ``[bs, max_q, hq, d]``.
    """
    bs, max_q, hq, d = q.shape
    page_size, kvh = k_cache.shape[1], k_cache.shape[2]
    offsets = torch.arange(page_size, device=q.device)
    slots = (page_table.long()[:, :, None] * page_size + offsets).view(bs, -1)
    # NOTE: GQA by grouping query heads (head h reads kv head h // group), no K/V repeat.
    qg = q.float().view(bs, max_q, kvh, hq // kvh, d)
    k = k_cache.view(-1, kvh, d)[slots].float()
    v = v_cache.view(-1, kvh, d)[slots].float()
    keys = torch.arange(slots.shape[1], device=q.device)
    # NOTE: zero V past each sequence so stale or poisoned pages cannot leak NaN through 0 * NaN.
    v = v.masked_fill((keys[None, :] >= seq_lens.long()[:, None])[:, :, None, None], 0.0)
    scores = torch.einsum("bqkgd,blkd->bkgql", qg, k) * scale
    q_len = torch.full_like(seq_lens, max_q) if q_lens is None else q_lens
    q_pos = (seq_lens - q_len).long()[:, None] + torch.arange(max_q, device=q.device)
    allowed = keys[None, None, :] <= q_pos[:, :, None]  # causal, hence also < seq_len
    if window is not None:
        allowed &= keys[None, None, :] >= q_pos[:, :, None] - window
    scores = scores.masked_fill(~allowed[:, None, None], float("-inf"))
    out = torch.einsum("bkgql,blkd->bqkgd", scores.softmax(dim=-1), v).reshape(bs, max_q, hq, d)
    return out.to(q.dtype)


def pad_queries(
    x: torch.Tensor, cu_seqlens_q: torch.Tensor, max_q: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Packed ``x [num_tokens, ...]`` → ``[bs, max_q, ...]``, plus row lengths and token ids.

    Returns the padded tensor, ``q_lens [bs]`` and ``index [bs, max_q]`` (the packed token of
    each padded row, ``num_tokens`` where the row is padding). Graph-safe: no host reads.
    """
    cu = cu_seqlens_q.long()
    q_lens = cu[1:] - cu[:-1]
    j = torch.arange(max_q, device=x.device)
    index = cu[:-1, None] + j[None, :]
    index = torch.where(j[None, :] < q_lens[:, None], index, x.shape[0])
    padded = torch.cat((x, x.new_zeros(1, *x.shape[1:])))[index]
    return padded, q_lens, index


def unpad_queries(out: torch.Tensor, index: torch.Tensor, num_tokens: int) -> torch.Tensor:
    """Inverse of :func:`pad_queries`: padded rows land in a dropped trailing row."""
    packed = out.new_zeros(num_tokens + 1, *out.shape[2:])
    packed.index_copy_(0, index.reshape(-1), out.reshape(-1, *out.shape[2:]))
    return packed[:num_tokens]


class ReferenceBackend:
    name = "reference"

    def forward(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        meta: StepMetadata,
        scale: float,
        window: int | None = None,
    ) -> torch.Tensor:
        b = meta.buffers
        padded, q_lens, index = pad_queries(q, b.cu_seqlens_q, meta.max_seqlen_q)
        out = paged_attention(padded, k_cache, v_cache, b.page_table, b.cache_seqlens, scale, q_lens, window)
        return unpad_queries(out, index, q.shape[0])

    def host_scalars(self) -> dict[str, Any]:
        return {}


register("reference", lambda device: True)(ReferenceBackend)
