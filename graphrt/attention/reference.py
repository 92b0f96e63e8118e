"""The torch reference backend: paged gather plus dense masked attention, in float32.

It runs on any device, inside CUDA graphs and the emulated engine alike: ragged queries are
padded to ``[bs, max_seqlen_q]`` by index arithmetic on ``cu_seqlens_q`` (no host sync, shapes
from the graph key), and it is the oracle the kernels are tested against.

An FP8 cache is read dequantised (``float32 × scale``) and the query rounded to FP8 first, as
FA3 reads them; sinks join each softmax's denominator (a token tree counts them once, in the
prefix half). ``qv`` (dense MLA's absorbed query, FA3's ``qv``) adds ``qv . v`` to every score.
Cross-attention (encoder-decoder models) gathers each request's encoder K/V through the encoder
page table and lets every query token see all of it. The rest is the same float32 math.
"""

from __future__ import annotations

from typing import Any

import torch

from graphrt.attention.base import Backend
from graphrt.attention.call import AttendCall
from graphrt.attention.capabilities import ALL_MODES, GraphSupport
from graphrt.kv.quant import LayerScales, dequantize, query_for, storage
from graphrt.metadata.base import StepMetadata


def masked_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    allowed: torch.Tensor,
    scale: float,
    sinks: torch.Tensor | None = None,
    qv: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Grouped-query attention of ``q [B, Q, hq, d]`` over ``k [B, L, kvh, d]``, ``v [B, L, kvh, dv]``.

    ``allowed [B, Q, L]`` bool; ``sinks [hq]``: a logit per head added to the denominator;
    ``qv [B, Q, hq, dv]``: a second query scored against the values (FA3's ``qv``), ``scores =
    (q . k + qv . v) * scale``. Returns ``out [B, Q, hq, dv]`` float32 and ``lse [B, Q, hq]``
    (natural log-sum-exp of the scaled scores and the sink; ``-inf`` where a row allows no key
    and has no sink, whose output is then 0).
    """
    bs, nq, hq, d = q.shape
    kvh, dv = k.shape[2], v.shape[-1]
    # NOTE: GQA by grouping query heads (head h reads kv head h // group), no K/V repeat.
    qg = q.float().view(bs, nq, kvh, hq // kvh, d)
    scores = torch.einsum("bqkgd,blkd->bkgql", qg, k.float())
    if qv is not None:
        qvg = qv.float().view(bs, nq, kvh, hq // kvh, dv)
        scores = scores + torch.einsum("bqkgd,blkd->bkgql", qvg, v.float())
    scores = (scores * scale).masked_fill(~allowed[:, None, None], float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    if sinks is not None:
        # NOTE: exp(sink) joins the denominator only: it has no value to add to the output.
        lse = torch.logaddexp(lse, sinks.float().view(1, kvh, hq // kvh, 1))
    probs = torch.exp(scores - lse.nan_to_num(neginf=0.0)[..., None])
    out = torch.einsum("bkgql,blkd->bqkgd", probs, v.float()).reshape(bs, nq, hq, dv)
    return out, lse.permute(0, 3, 1, 2).reshape(bs, nq, hq)


def gather_slots(cache: torch.Tensor, slots: torch.Tensor, scale: torch.Tensor | None) -> torch.Tensor:
    """``cache [pages, page_size, kvh, d]`` at slots ``slots [...]`` → ``[..., kvh, d]``;
    dequantised to float32 by ``scale`` (an FP8 cache, gathered as bytes)."""
    kvh, d = cache.shape[2:]
    rows = storage(cache).view(-1, kvh, d)[slots]
    return rows if scale is None else dequantize(rows.view(cache.dtype), scale)


def paged_keys(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    page_table: torch.Tensor,
    seq_lens: torch.Tensor,
    kv_scales: LayerScales | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Gather ``[bs, max_pages * page_size, kvh, d]`` keys and values through the page table
    (float32 when ``kv_scales`` dequantise an FP8 cache).

    Values past each sequence are zeroed so stale or poisoned pages cannot leak NaN (0 * NaN).
    """
    bs = page_table.shape[0]
    page_size = k_cache.shape[1]
    offsets = torch.arange(page_size, device=page_table.device)
    slots = (page_table.long()[:, :, None] * page_size + offsets).view(bs, -1)
    k = gather_slots(k_cache, slots, None if kv_scales is None else kv_scales.k)
    v = gather_slots(v_cache, slots, None if kv_scales is None else kv_scales.v)
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
    sinks: torch.Tensor | None = None,
    kv_scales: LayerScales | None = None,
    qv: torch.Tensor | None = None,
) -> torch.Tensor:
    """Causal attention of ``q [bs, max_q, hq, d]`` over each request's pages.

    ``page_table [bs, max_pages]`` int32 page ids, ``seq_lens [bs]`` KV lengths including the
    query tokens, which are the last ``q_lens[b]`` positions (default: all ``max_q``); query
    rows past ``q_lens[b]`` are padding (their output is meaningless and dropped by callers).
    ``window``: a query at position ``p`` sees keys ``p - window … p`` only; ``sinks``,
    ``kv_scales``, ``qv [bs, max_q, hq, dv]``: as :class:`~graphrt.attention.base.AttentionBackend`.
    Returns ``[bs, max_q, hq, dv]`` float32.
    """
    max_q = q.shape[1]
    k, v = paged_keys(k_cache, v_cache, page_table, seq_lens, kv_scales)
    keys = torch.arange(k.shape[1], device=q.device)
    q_len = torch.full_like(seq_lens, max_q) if q_lens is None else q_lens
    q_pos = (seq_lens - q_len).long()[:, None] + torch.arange(max_q, device=q.device)
    allowed = keys[None, None, :] <= q_pos[:, :, None]  # causal, hence also < seq_len
    if window is not None:
        allowed &= keys[None, None, :] >= q_pos[:, :, None] - window
    return masked_attention(q, k, v, allowed, scale, sinks, qv)[0]


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
    sinks: torch.Tensor | None = None,
    kv_scales: LayerScales | None = None,
    qv: torch.Tensor | None = None,
) -> torch.Tensor:
    """Tree attention: the shared prefix (non-causal) merged with each token's expand list.

    Float32 out. The sink joins the prefix half only: merging adds the halves' denominators,
    so a sink in both would be counted twice.
    """
    b, c = meta.buffers, meta.cascade
    assert c is not None
    padded, _, index = pad_queries(q, b.cu_seqlens_q, meta.max_seqlen_q)
    padded_qv = None if qv is None else pad_queries(qv, b.cu_seqlens_q, meta.max_seqlen_q)[0]
    k, v = paged_keys(k_cache, v_cache, b.page_table, c.prefix_seqlens, kv_scales)
    keys = torch.arange(k.shape[1], device=q.device)
    allowed = (keys[None, :] < c.prefix_seqlens.long()[:, None])[:, None, :].expand(-1, padded.shape[1], -1)
    o_pre, lse_pre = masked_attention(padded, k, v, allowed, scale, sinks, padded_qv)
    o_pre, lse_pre = unpad_queries(o_pre, index, q.shape[0]), unpad_queries(lse_pre, index, q.shape[0])
    slots = c.expand_table.long()
    width = torch.arange(slots.shape[1], device=q.device)
    allowed = (width[None, :] < c.expand_seqlens.long()[:, None])[:, None, :]
    k_x = gather_slots(k_cache, slots, None if kv_scales is None else kv_scales.k)
    v_x = gather_slots(v_cache, slots, None if kv_scales is None else kv_scales.v)
    v_x = v_x.masked_fill(~allowed[:, 0, :, None, None], 0.0)
    o_x, lse_x = masked_attention(
        q[:, None], k_x, v_x, allowed, scale, None, None if qv is None else qv[:, None]
    )
    return merge_states(o_pre, lse_pre, o_x[:, 0], lse_x[:, 0])


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

    It serves MHA/GQA (built with the cache ``dtype``) and dense MLA (``qv``; built with the
    dense-MLA kind's ``dtype``, ``rope_dim`` and ``kv_lora_rank``, which it does not need).
    """

    name = "reference"
    graph_support = GraphSupport(
        ALL_MODES, trees=True, window=True, sinks=True, fp8_kv=True, qv=True, cross=True, chunked_local=True
    )

    def __init__(self, dtype: torch.dtype | None = None, **_: Any) -> None:
        self.dtype = dtype

    def forward(self, call: AttendCall) -> torch.Tensor:
        dtype, q, meta, qv = call.q.dtype, fp8_query(call.q, call.k_cache, call.kv_scales), call.meta, call.qv
        caches, scale, sinks, kv_scales = (call.k_cache, call.v_cache), call.scale, call.sinks, call.kv_scales
        if meta.cascade is not None:
            return cascade_attention(q, *caches, meta, scale, sinks, kv_scales, qv).to(dtype)
        b = meta.buffers
        padded, q_lens, index = pad_queries(q, b.cu_seqlens_q, meta.max_seqlen_q)
        padded_qv = None if qv is None else pad_queries(qv, b.cu_seqlens_q, meta.max_seqlen_q)[0]
        out = paged_attention(
            padded,
            *caches,
            b.page_table,
            b.cache_seqlens,
            scale,
            q_lens,
            call.window,
            sinks,
            kv_scales,
            padded_qv,
        )
        return unpad_queries(out.to(dtype), index, q.shape[0])

    def cross(self, call: AttendCall, encoder: Any) -> torch.Tensor:
        """:func:`cross_attention` in ``q``'s dtype (the query rounded to FP8 beside an FP8 cache)."""
        dtype, q = call.q.dtype, fp8_query(call.q, call.k_cache, call.kv_scales)
        caches = (call.k_cache, call.v_cache)
        return cross_attention(q, *caches, call.meta, encoder, call.scale, call.kv_scales).to(dtype)


def cross_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: StepMetadata,
    encoder: Any,
    scale: float,
    kv_scales: LayerScales | None = None,
) -> torch.Tensor:
    """Non-causal attention of packed ``q [T, hq, d]`` over each request's encoder keys
    (``encoder.encoder_page_table``, ``encoder.encoder_lens``); float32 ``[T, hq, d]``."""
    padded, _, index = pad_queries(q, meta.buffers.cu_seqlens_q, meta.max_seqlen_q)
    lens = encoder.encoder_lens
    k, v = paged_keys(k_cache, v_cache, encoder.encoder_page_table, lens, kv_scales)
    keys = torch.arange(k.shape[1], device=q.device)
    allowed = (keys[None, :] < lens.long()[:, None])[:, None, :].expand(-1, padded.shape[1], -1)
    return unpad_queries(masked_attention(padded, k, v, allowed, scale)[0], index, q.shape[0])


def fp8_query(q: torch.Tensor, k_cache: torch.Tensor, kv_scales: LayerScales | None) -> torch.Tensor:
    """``q`` as FA3 reads it next to an FP8 cache (:func:`graphrt.kv.quant.query_for`; float32
    here), else ``q`` itself."""
    read = query_for(q, k_cache, kv_scales)
    return read if read is q else read.float()
