"""Single-token decode attention over the paged KV cache, split over the keys (Triton, PDL).

At a small batch FA3's decode call costs 6-10 µs whatever the context: one CTA per (request, KV
head) walks every key, so a bs-1 Llama-3.2-1B step runs 8 CTAs on 132 SMs, 16 times a step
(``bench/results/h100/session-1127b``). This kernel splits each (request, KV head) over the keys
so the step fills the GPU, and merges the splits in a second launch. On the H100 the 1B step at
bs 1 went from 1235 to 1136 µs, the 8B from 5888 to 5823 µs, and SmolLM2's engine from 1493 to
1828 tokens/s (GPU busy 647 -> 510 µs a token):

- ``_decode_split``: program ``(b, h_k, s)`` takes the ``s``-th share of request ``b``'s
  ``BLOCK_N``-key blocks (``cache_seqlens[b]`` keys, pages from ``page_table[b]``), scores the
  ``G`` query heads of KV head ``h_k`` with ``tl.dot`` (``G`` padded to 16 rows), and keeps an
  online softmax in fp32: its running max ``m``, denominator ``l`` and ``acc = sum p v``. It
  reads the page table and lengths before ``gdc_wait()`` (written long before the layer), ``q``
  and the cache after it (the previous kernel stores this step's k and v).
- ``_decode_merge``: per (request, query head), the splits' states weighted by ``exp(m_s - M)``
  in split order, divided once; a request with no keys (a pad row) gets zeros.

The split count is a function of the bucket and the page table's width only (a graph key):
enough programs for two waves of the SMs, never more splits than key blocks. The math is the
reference backend's (``graphrt.attention.reference``): fp32 scores and sums, one rounding of the
output; the order of the sums differs from FA3's, so the two agree to bf16 rounding.
"""

from __future__ import annotations

import torch

from graphrt.attention.fa3_plan import FULL_SHARE, sm_count
from graphrt.metadata.base import StepMetadata
from graphrt.step.switches import KERNELS_PDL_ENV, pdl_enabled, tl, triton, triton_enabled

#: ``GRAPHRT_DECODE_ATTENTION``: ``1`` (default) runs single-token decode through this kernel
#: where it applies, ``0`` keeps FA3's call.
ENV = "GRAPHRT_DECODE_ATTENTION"
#: Its PDL switch, the GEMMs' (:data:`graphrt.step.switches.KERNELS_PDL_ENV`).
PDL_ENV = KERNELS_PDL_ENV
DTYPES = (torch.bfloat16, torch.float16)
BLOCK_N = 64
#: Head dims the kernel takes (powers of two: ``tl.arange`` over the head).
HEAD_DIMS = (64, 128, 256)
MAX_GROUP = 16


def enabled(device: torch.device) -> bool:
    """Whether the kernel runs on ``device`` (:data:`ENV`, CUDA with Triton)."""
    return device.type == "cuda" and triton_enabled(ENV, device)


def fits(q: torch.Tensor, k_cache: torch.Tensor, page_table: torch.Tensor) -> bool:
    """Whether the kernel takes one query token per request of ``q [B, Hq, D]`` over a cache
    ``[pages, page_size, Hk, D]`` in ``q``'s dtype (16-bit), ``D`` in :data:`HEAD_DIMS`."""
    if q.dim() != 3 or k_cache.dim() != 4:
        return False
    heads, d = q.shape[1], q.shape[2]
    return (
        q.shape[0] == page_table.shape[0]
        and q.dtype in DTYPES
        and k_cache.dtype == q.dtype
        and d in HEAD_DIMS
        and k_cache.shape[3] == d
        and heads % k_cache.shape[2] == 0
        and heads // k_cache.shape[2] <= MAX_GROUP
        and q.stride(2) == 1
        and k_cache.is_contiguous()
    )


def num_splits(batch: int, heads_k: int, keys: int, sms: int) -> int:
    """Splits per (request, KV head): two waves of ``sms`` programs, at most one per key block
    of the ``keys``-wide page table, at least 1."""
    want = -(-2 * sms // (batch * heads_k))
    return max(1, min(want, -(-keys // BLOCK_N)))


def takes(q: torch.Tensor, k_cache: torch.Tensor, meta: StepMetadata, *options: object) -> bool:
    """One query token per request, every cached key visible, no attention ``options`` (window,
    sinks, FP8 scales, ``qv``: all None), a bucket whose ``requests x KV heads`` leave FA3's
    CTAs short of :data:`~graphrt.attention.fa3_plan.FULL_SHARE` of the SMs, and tensors this
    kernel takes (:data:`ENV` on): what a backend checks before :func:`attend`. Fuller buckets
    keep FA3's call (unsplit): there the Llama-3-8B step at bs 16 ran 82 µs slower here."""
    b = meta.buffers
    return (
        all(option is None for option in options)
        and meta.cascade is None
        and meta.max_seqlen_q == 1
        and q.shape[0] == b.cache_seqlens.shape[0]
        and enabled(q.device)
        and fits(q, k_cache, b.page_table)
        and q.shape[0] * k_cache.shape[2] < FULL_SHARE * sm_count(q.device)
    )


def attend(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta: StepMetadata, scale: float
) -> torch.Tensor:
    """The step's single-token attention through the split decode kernel (its splits a function
    of the bucket and the page table's width: a graph key)."""
    b = meta.buffers
    keys = b.page_table.shape[1] * meta.page_size
    splits = num_splits(q.shape[0], k_cache.shape[2], keys, sm_count(q.device))
    pdl = pdl_enabled(PDL_ENV, q.device)
    return decode_attention(q, k_cache, v_cache, b.page_table, b.cache_seqlens, scale, splits, pdl)


def decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    page_table: torch.Tensor,
    cache_seqlens: torch.Tensor,
    scale: float,
    splits: int,
    pdl: bool = True,
) -> torch.Tensor:
    """Attention of one query token per request over its cached keys.

    ``q [B, Hq, D]`` (16-bit, unit stride along ``D``), caches ``[pages, page_size, Hk, D]``,
    ``page_table [B, max_pages]`` int32 page ids, ``cache_seqlens [B]`` int32 keys per request
    (the query is the last), ``splits`` from :func:`num_splits`. Returns ``[B, Hq, D]`` in ``q``'s
    dtype. Rows with no keys return zeros.
    """
    return torch.ops.graphrt.decode_attention(
        q, k_cache, v_cache, page_table, cache_seqlens, scale, splits, pdl
    )


def _decode_attention(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, page_table: torch.Tensor,
    cache_seqlens: torch.Tensor, scale: float, splits: int, pdl: bool,
) -> torch.Tensor:  # fmt: skip
    assert triton is not None, "decode attention needs Triton"
    b, heads, d = q.shape
    page, heads_k = k_cache.shape[1], k_cache.shape[2]
    group = heads // heads_k
    m = torch.empty((b, heads, splits), dtype=torch.float32, device=q.device)
    l_sum = torch.empty_like(m)
    acc = torch.empty((b, heads, splits, d), dtype=torch.float32, device=q.device)
    out = torch.empty_like(q)
    _decode_split[(b, heads_k, splits)](
        q, k_cache, v_cache, page_table, cache_seqlens, m, l_sum, acc,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        page_table.stride(0), scale * 1.4426950408889634,
        PAGE=page, D=d, G=group, BLOCK_G=max(16, triton.next_power_of_2(group)), BLOCK_N=BLOCK_N,
        SPLITS=splits, PDL=pdl, num_warps=4, launch_pdl=pdl,
    )  # fmt: skip
    _decode_merge[(b, heads)](
        m, l_sum, acc, out, out.stride(0), out.stride(1),
        D=d, SPLITS=splits, BLOCK_S=max(2, triton.next_power_of_2(splits)), PDL=pdl, num_warps=4, launch_pdl=pdl,
    )  # fmt: skip
    return out


_LIB = torch.library.Library("graphrt", "FRAGMENT")
_LIB.define(
    "decode_attention(Tensor q, Tensor k_cache, Tensor v_cache, Tensor page_table, Tensor cache_seqlens, "
    "float scale, int splits, bool pdl) -> Tensor"
)
_LIB.impl("decode_attention", _decode_attention, "CompositeExplicitAutograd")


if triton is not None:

    @triton.jit
    def _decode_split(
        q, k_cache, v_cache, page_table, seqlens, m_out, l_out, acc_out,
        q_sb, q_sh, kc_sp, kc_ss, kc_sh, pt_sb, scale_log2,
        PAGE: tl.constexpr, D: tl.constexpr, G: tl.constexpr, BLOCK_G: tl.constexpr,
        BLOCK_N: tl.constexpr, SPLITS: tl.constexpr, PDL: tl.constexpr,
    ):  # fmt: skip
        b, hk, s = tl.program_id(0), tl.program_id(1), tl.program_id(2)
        rg, rd = tl.arange(0, BLOCK_G), tl.arange(0, D)
        seqlen = tl.load(seqlens + b)  # NOTE: written before the layer: read ahead of the wait
        per = tl.cdiv(tl.cdiv(seqlen, BLOCK_N), SPLITS) * BLOCK_N
        start = s * per
        end = tl.minimum(start + per, seqlen)
        if PDL:
            tl.extra.cuda.gdc_wait()  # NOTE: q and this step's k/v come from the kernel before
            tl.extra.cuda.gdc_launch_dependents()
        heads = hk * G + rg
        q_ptrs = q + b.to(tl.int64) * q_sb + heads[:, None] * q_sh + rd[None, :]
        qt = tl.load(q_ptrs, mask=rg[:, None] < G, other=0.0)
        m = tl.full((BLOCK_G,), float("-inf"), dtype=tl.float32)
        l_sum = tl.zeros((BLOCK_G,), dtype=tl.float32)
        acc = tl.zeros((BLOCK_G, D), dtype=tl.float32)
        for n0 in range(start, end, BLOCK_N):
            pos = n0 + tl.arange(0, BLOCK_N)
            valid = pos < end
            pages = tl.load(page_table + b.to(tl.int64) * pt_sb + pos // PAGE, mask=valid, other=0)
            rows = pages.to(tl.int64) * kc_sp + (pos % PAGE) * kc_ss + hk * kc_sh
            kt = tl.load(k_cache + rows[:, None] + rd[None, :], mask=valid[:, None], other=0.0)
            scores = tl.dot(qt, tl.trans(kt)) * scale_log2  # NOTE: log2 units: exp2 below
            scores = tl.where(valid[None, :], scores, float("-inf"))
            m_new = tl.maximum(m, tl.max(scores, axis=1))
            p = tl.exp2(scores - m_new[:, None])
            alpha = tl.exp2(m - m_new)
            l_sum = l_sum * alpha + tl.sum(p, axis=1)
            vt = tl.load(v_cache + rows[:, None] + rd[None, :], mask=valid[:, None], other=0.0)
            acc = acc * alpha[:, None] + tl.dot(p.to(vt.dtype), vt)
            m = m_new
        state = (b * (G * tl.num_programs(1)) + heads) * SPLITS + s
        keep = rg < G
        tl.store(m_out + state, m, mask=keep)
        tl.store(l_out + state, l_sum, mask=keep)
        tl.store(acc_out + state[:, None] * D + rd[None, :], acc, mask=keep[:, None])

    @triton.jit
    def _decode_merge(
        m_in, l_in, acc_in, out, o_sb, o_sh,
        D: tl.constexpr, SPLITS: tl.constexpr, BLOCK_S: tl.constexpr, PDL: tl.constexpr,
    ):  # fmt: skip
        b, h = tl.program_id(0), tl.program_id(1)
        rs, rd = tl.arange(0, BLOCK_S), tl.arange(0, D)
        if PDL:
            tl.extra.cuda.gdc_wait()
            tl.extra.cuda.gdc_launch_dependents()
        state = (b * tl.num_programs(1) + h) * SPLITS + rs
        has = rs < SPLITS
        m = tl.load(m_in + state, mask=has, other=float("-inf"))
        l_sum = tl.load(l_in + state, mask=has, other=0.0)
        top = tl.max(m, axis=0)
        w = tl.where(m > float("-inf"), tl.exp2(m - top), 0.0)
        acc = tl.load(acc_in + state[:, None] * D + rd[None, :], mask=has[:, None], other=0.0)
        total = tl.sum(l_sum * w, axis=0)
        o = tl.sum(acc * w[:, None], axis=0) / tl.where(total > 0, total, 1.0)
        o = tl.where(total > 0, o, 0.0)
        tl.store(out + b.to(tl.int64) * o_sb + h * o_sh + rd, o.to(out.dtype.element_ty))
