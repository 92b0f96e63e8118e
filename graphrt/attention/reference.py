"""The torch reference backend: paged gather plus dense masked attention, in float32.

It runs on any device, inside CUDA graphs and the emulated engine alike: ragged queries are
padded to ``[bs, max_seqlen_q]`` by index arithmetic on ``cu_seqlens_q`` (no host sync, shapes
from the graph key), and it is the oracle the kernels are tested against.
"""

from __future__ import annotations

from typing import Any

import torch

from graphrt.attention.base import Backend
from graphrt.metadata.base import StepMetadata


def masked_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    allowed: torch.Tensor,
    scale: float,
    qv: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Grouped-query attention of ``q [B, Q, hq, d]`` over ``k [B, L, kvh, d]``, ``v [B, L, kvh, dv]``.

    ``allowed [B, Q, L]`` bool. ``qv [B, Q, hq, dv]``: a second query scored against the
    values (FA3's ``qv``): ``scores = (q . k + qv . v) * scale`` (dense MLA's absorbed form).
    Returns ``out [B, Q, hq, dv]`` float32 and ``lse [B, Q, hq]`` (natural log-sum-exp of the
    scaled scores; ``-inf`` where a row allows no key, whose output is then 0).
    """
    bs, nq, hq, d = q.shape
    kvh, dv = k.shape[2], v.shape[-1]
    # NOTE: GQA by grouping query heads (head h reads kv head h // group), no K/V repeat.
    qg = q.float().view(bs, nq, kvh, hq // kvh, d)
    scores = torch.einsum("bqkgd,blkd->bkgql", qg, k.float())
    if qv is not None:
        scores = scores + torch.einsum(
            "bqkgd,blkd->bkgql", qv.float().view(bs, nq, kvh, hq // kvh, dv), v.float()
        )
    scores = (scores * scale).masked_fill(~allowed[:, None, None], float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    probs = torch.exp(scores - lse.nan_to_num(neginf=0.0)[..., None])
    out = torch.einsum("bkgql,blkd->bqkgd", probs, v.float()).reshape(bs, nq, hq, dv)
    return out, lse.permute(0, 3, 1, 2).reshape(bs, nq, hq)


def paged_keys(
    k_cache: torch.Tensor, v_cache: torch.Tensor, page_table: torch.Tensor, seq_lens: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Gather ``[bs, max_pages * page_size, kvh, d]`` keys and values (their own ``d``) through
    the page table.

    Values past each sequence are zeroed so stale or poisoned pages cannot leak NaN (0 * NaN).
    """
    bs = page_table.shape[0]
    page_size = k_cache.shape[1]
    offsets = torch.arange(page_size, device=page_table.device)
    slots = (page_table.long()[:, :, None] * page_size + offsets).view(bs, -1)
    k = k_cache.view(-1, *k_cache.shape[2:])[slots]
    v = v_cache.view(-1, *v_cache.shape[2:])[slots]
    keys = torch.arange(slots.shape[1], device=slots.device)
    return k, v.masked_fill((keys[None, :] >= seq_lens.long()[:, None])[:, :, None, None], 0.0)


def paged_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    page_table: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    q_lens: torch.Tensor | None = None,
    window: int | None = None,
    qv: torch.Tensor | None = None,
) -> torch.Tensor:
    """Causal attention of ``q [bs, max_q, hq, d]`` over each request's pages.

    ``page_table [bs, max_pages]`` int32 page ids, ``seq_lens [bs]`` KV lengths including the
    query tokens, which are the last ``q_lens[b]`` positions (default: all ``max_q``); query
    rows past ``q_lens[b]`` are padding (their output is meaningless and dropped by callers).
    ``window``: a query at position ``p`` sees keys ``p - window … p`` only. ``qv [bs, max_q,
    hq, dv]``: see :func:`masked_attention`. Returns ``[bs, max_q, hq, dv]`` in ``q``'s dtype.
    """
    max_q = q.shape[1]
    k, v = paged_keys(k_cache, v_cache, page_table, seq_lens)
    keys = torch.arange(k.shape[1], device=q.device)
    q_len = torch.full_like(seq_lens, max_q) if q_lens is None else q_lens
    q_pos = (seq_lens - q_len).long()[:, None] + torch.arange(max_q, device=q.device)
    allowed = keys[None, None, :] <= q_pos[:, :, None]  # causal, hence also < seq_len
    if window is not None:
        allowed &= keys[None, None, :] >= q_pos[:, :, None] - window
    return masked_attention(q, k, v, allowed, scale, qv)[0].to(q.dtype)


def merge_states(
    o_a: torch.Tensor, lse_a: torch.Tensor, o_b: torch.Tensor, lse_b: torch.Tensor
) -> torch.Tensor:
    """Merge two partial attentions ``o [T, h, d]`` with their ``lse [T, h]`` (torch merge_state)."""
    lse = torch.logaddexp(lse_a, lse_b)
    finite = lse.nan_to_num(neginf=0.0)
    w_a = torch.exp(lse_a - finite).nan_to_num(0.0)[..., None]
    w_b = torch.exp(lse_b - finite).nan_to_num(0.0)[..., None]
    return o_a.float() * w_a + o_b.float() * w_b


def cascade_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: StepMetadata,
    scale: float,
    qv: torch.Tensor | None = None,
) -> torch.Tensor:
    """Tree attention: the shared prefix (non-causal) merged with each token's expand list."""
    b, c = meta.buffers, meta.cascade
    assert c is not None
    padded, _, index = pad_queries(q, b.cu_seqlens_q, meta.max_seqlen_q)
    padded_qv = None if qv is None else pad_queries(qv, b.cu_seqlens_q, meta.max_seqlen_q)[0]
    k, v = paged_keys(k_cache, v_cache, b.page_table, c.prefix_seqlens)
    keys = torch.arange(k.shape[1], device=q.device)
    allowed = (keys[None, :] < c.prefix_seqlens.long()[:, None])[:, None, :].expand(-1, padded.shape[1], -1)
    o_pre, lse_pre = masked_attention(padded, k, v, allowed, scale, padded_qv)
    o_pre, lse_pre = unpad_queries(o_pre, index, q.shape[0]), unpad_queries(lse_pre, index, q.shape[0])
    slots = c.expand_table.long()
    width = torch.arange(slots.shape[1], device=q.device)
    allowed = (width[None, :] < c.expand_seqlens.long()[:, None])[:, None, :]
    k_x = k_cache.view(-1, *k_cache.shape[2:])[slots]
    v_x = v_cache.view(-1, *v_cache.shape[2:])[slots].masked_fill(~allowed[:, 0, :, None, None], 0.0)
    o_x, lse_x = masked_attention(q[:, None], k_x, v_x, allowed, scale, None if qv is None else qv[:, None])
    return merge_states(o_pre, lse_pre, o_x[:, 0], lse_x[:, 0]).to(q.dtype)


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
    # NOTE: pad entries of index all name the dropped row num_tokens.
    packed.index_copy_(0, index.reshape(-1), out.reshape(-1, *out.shape[2:]))
    return packed[:num_tokens]


class ReferenceBackend(Backend):
    """Gather through the page table, then dense masked attention (float32): the oracle.

    It serves MHA/GQA (built with the cache ``dtype``) and dense MLA (``qv``: built with the
    dense-MLA kind's ``dtype``, ``rope_dim`` and ``kv_lora_rank``, which it does not need).
    """

    name = "reference"

    def __init__(self, dtype: torch.dtype | None = None, **_: Any) -> None:
        self.dtype = dtype

    def forward(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        meta: StepMetadata,
        scale: float,
        window: int | None = None,
        plan: Any = None,
        qv: torch.Tensor | None = None,
    ) -> torch.Tensor:
        if meta.cascade is not None:
            return cascade_attention(q, k_cache, v_cache, meta, scale, qv)
        b = meta.buffers
        padded, q_lens, index = pad_queries(q, b.cu_seqlens_q, meta.max_seqlen_q)
        padded_qv = None if qv is None else pad_queries(qv, b.cu_seqlens_q, meta.max_seqlen_q)[0]
        out = paged_attention(
            padded, k_cache, v_cache, b.page_table, b.cache_seqlens, scale, q_lens, window, padded_qv
        )
        return unpad_queries(out, index, q.shape[0])
