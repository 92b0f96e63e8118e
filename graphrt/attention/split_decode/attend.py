"""Single-token decode attention over the paged KV cache, split over the keys (Triton, PDL).

At a small batch FA3's decode call costs 6-10 µs whatever the context: one CTA per (request, KV
head) walks every key, so a bs-1 Llama-3.2-1B step runs 8 CTAs on 132 SMs, 16 times a step
(``bench/results/h100/session-1127b``). This kernel splits each (request, KV head) over the keys
so the step fills the GPU, and the last split program of each (request, KV head) merges the
splits. On the H100, with the merge then a second launch, the 1B step at bs 1 went from 1235 to
1136 µs, the 8B from 5888 to 5823 µs, and SmolLM2's engine from 1493 to 1828 tokens/s (GPU busy
647 -> 510 µs a token); merging in the split launch took the 1B's span from 1135..1144 to
1104 / 1116 µs (``decode_launch`` has the numbers):

- ``_decode_split``: program ``(b, h_k, s)`` takes the ``s``-th share of request ``b``'s
  ``BLOCK_N``-key blocks (``cache_seqlens[b]`` keys, pages from ``page_table[b]``), scores the
  ``G`` query heads of KV head ``h_k`` with ``tl.dot`` (``G`` padded to 16 rows), and keeps an
  online softmax in fp32: its running max ``m``, denominator ``l`` and ``acc = sum p v``. It
  reads the lengths before ``gdc_wait()`` (written long before the layer; with RoPE the
  ``cos_sin`` row and the slot too), ``q`` and the cache after it (the previous kernel stores
  this step's k and v, or produces them: the qkv projection, with RoPE).
- the merge: per (request, query head), the splits' states weighted by ``exp(m_s - M)``,
  divided once; a request with no keys (a pad row) gets zeros. By default the last program
  holding keys of a (request, KV head) merges its ``G`` heads at the end of the split launch
  (one launch); ``GRAPHRT_DECODE_MERGE_LAST=0`` merges in a second launch, ``_decode_merge``
  (``decode_launch`` says how each works).

With RoPE folded in (:func:`attend_rope`, ``GRAPHRT_DECODE_ROPE=1``; off by default) the split
launch also does :func:`graphrt.kv.rope_store.rope_store`'s work: it rotates ``q`` on load,
attends the new token's rotated key and value straight from the projection, and one program per
(request, KV head) writes them at ``out_cache_loc`` (``decode_triton`` says how): the cache holds
the bits ``rope_store`` + :func:`attend` leave (pad rows' dummy slot included).

The split count is a function of the bucket and the page table's width only (a graph key):
enough programs for two waves of the SMs, never more splits than key blocks. The math is the
reference backend's (``graphrt.attention.reference``): fp32 scores and sums, one rounding of the
output; the order of the sums differs from FA3's, so the two agree to bf16 rounding.
"""

from __future__ import annotations

import os

import torch

from graphrt.attention.fa3_plan import sm_count
from graphrt.attention.split_decode import launch as decode_launch
from graphrt.kernels.switches import KERNELS_PDL_ENV, pdl_enabled, triton, triton_enabled  # noqa: F401
from graphrt.kv import rope_store
from graphrt.metadata.base import StepMetadata

#: ``GRAPHRT_DECODE_ATTENTION``: ``1`` (default) runs single-token decode through this kernel
#: where it applies, ``0`` keeps FA3's call.
ENV = "GRAPHRT_DECODE_ATTENTION"
#: ``GRAPHRT_DECODE_ROPE``: ``1`` folds RoPE and the KV store into the kernel where it takes the
#: step (:func:`rope_takes`); ``0`` (default) keeps ``rope_store`` + the kernel. Off because it
#: does not pay everywhere on the H100 (bs 1 device busy, ``bench/results/h100/session-1127c/fold``):
#: Llama-3.2-1B 1050 -> 1079 µs, the 8B shape 5678 -> 5675 µs, SmolLM2's engine 469 -> 458 µs;
#: with the merge by the last split, 1B 1035 -> 1063 µs and 8B 5735 -> 6036 µs (session-1127g).
ROPE_ENV = "GRAPHRT_DECODE_ROPE"
#: Its PDL switch, the GEMMs' (:data:`graphrt.kernels.switches.KERNELS_PDL_ENV`).
PDL_ENV = KERNELS_PDL_ENV
DTYPES = (torch.bfloat16, torch.float16)
#: Head dims the kernel takes (powers of two: ``tl.arange`` over the head).
HEAD_DIMS = (64, 128, 256)
MAX_GROUP = 16
#: ``GRAPHRT_DECODE_MAX_SPLITS``: a cap on :func:`num_splits`' count (unset: none), for timing
#: fewer splits. On the H100 at bs 1, context 512 (33 splits uncapped) caps of 16 / 8 / 4 gained
#: nothing: 1B busy 1035 -> 1036 / 1066 / 1087 µs, 8B 5743 -> 5744 / 5768 / 5802 (session-1127g).
#: Still a function of the bucket and the table's width: read per launch, fixed per process.
MAX_SPLITS_ENV = "GRAPHRT_DECODE_MAX_SPLITS"
#: The merge's switch (:mod:`graphrt.attention.split_decode.launch` says what it does).
MERGE_LAST_ENV = decode_launch.MERGE_LAST_ENV
BLOCK_N = decode_launch.BLOCK_N
#: The SMs the split count assumes under Triton's interpreter (the CPU has none): a few splits.
INTERPRETER_SMS = 4


def enabled(device: torch.device) -> bool:
    """Whether the kernel runs on ``device`` (:data:`ENV`: CUDA with Triton, or the CPU under
    Triton's interpreter with ``ENV=interpret``)."""
    return triton_enabled(ENV, device)


def rope_enabled() -> bool:
    """Whether RoPE and the KV store fold into the kernel where it runs (:data:`ROPE_ENV` is 1)."""
    return os.environ.get(ROPE_ENV, "0") == "1"


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
    sinks, FP8 scales, ``qv``: all None) and tensors this kernel takes (:data:`ENV` on): what a
    backend checks before :func:`attend`."""
    b = meta.buffers
    return (
        all(option is None for option in options)
        and meta.cascade is None
        and meta.max_seqlen_q == 1
        and q.shape[0] == b.cache_seqlens.shape[0]
        and enabled(q.device)
        and fits(q, k_cache, b.page_table)
    )


def attend(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta: StepMetadata, scale: float
) -> torch.Tensor:
    """The step's single-token attention through the split decode kernel."""
    b = meta.buffers
    return decode_attention(
        q, k_cache, v_cache, b.page_table, b.cache_seqlens, scale, *_split_plan(q, k_cache, meta)
    )


def _split_plan(q: torch.Tensor, k_cache: torch.Tensor, meta: StepMetadata) -> tuple[int, bool]:
    """The step's split count (a function of the bucket and the page table's width: a graph
    key) and whether it launches with PDL."""
    keys = meta.buffers.page_table.shape[1] * meta.page_size
    splits = num_splits(q.shape[0], k_cache.shape[2], keys, sms(q.device))
    return min(splits, split_cap()), pdl_enabled(PDL_ENV, q.device)


def sms(device: torch.device) -> int:
    """The SMs the split count fills: the GPU's, or :data:`INTERPRETER_SMS` on the CPU."""
    return sm_count(device) if device.type == "cuda" else INTERPRETER_SMS


def split_cap() -> int:
    """:data:`MAX_SPLITS_ENV` as a positive int (a large one when unset)."""
    raw = os.environ.get(MAX_SPLITS_ENV, "")
    if raw and not (raw.isdigit() and int(raw) > 0):
        raise ValueError(f"{MAX_SPLITS_ENV}={raw!r}: want a positive integer")
    return int(raw) if raw else 1 << 30


def rope_takes(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cos_sin: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: StepMetadata,
    *options: object,
) -> bool:
    """Whether :func:`attend_rope` takes the step: :func:`takes` it, :data:`ROPE_ENV` on, the
    tensors ``rope_store``'s kernel takes (16-bit caches: an FP8 cache keeps ``rope_store``),
    one token per request in ``cos_sin``, K and V caches alike."""
    return (
        rope_enabled()
        and takes(q, k_cache, meta, *options)
        and rope_store.fits(q, k, v, cos_sin, k_cache)
        and cos_sin.shape[0] == q.shape[0]
        and k.shape[1] == v.shape[1] == k_cache.shape[2]
        and v_cache.dtype == k_cache.dtype
        and v_cache.shape == k_cache.shape
        and v_cache.is_contiguous()
    )


def attend_rope(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cos_sin: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    loc: torch.Tensor,
    meta: StepMetadata,
    scale: float,
) -> torch.Tensor:
    """``rope_store`` + :func:`attend` in the kernel's launch(es) (what :func:`rope_takes` allows)."""
    b = meta.buffers
    return decode_rope_attention(
        q,
        k,
        v,
        cos_sin,
        loc,
        k_cache,
        v_cache,
        b.page_table,
        b.cache_seqlens,
        scale,
        *_split_plan(q, k_cache, meta),
    )


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


def decode_rope_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cos_sin: torch.Tensor,
    loc: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    page_table: torch.Tensor,
    cache_seqlens: torch.Tensor,
    scale: float,
    splits: int,
    pdl: bool = True,
) -> torch.Tensor:
    """:func:`decode_attention` of ``q`` and ``k`` rotated by ``cos_sin``, with the rotated ``k``
    and ``v`` stored at ``loc`` first (what :func:`~graphrt.kv.rope_store.rope_store` does).

    ``q [B, Hq, D]``, ``k``/``v [B, Hk, D]`` not yet rotated (views of the qkv projection: any
    token stride, heads packed), ``cos_sin [B, D]`` (cos half, sin half), ``loc [B]`` int64
    slots (any stride); the rest as :func:`decode_attention`. Request ``b``'s last key
    (position ``cache_seqlens[b] - 1``) sits at slot ``loc[b]``: that key and value are read
    from ``k``/``v``, never from the cache. Writes ``k_cache``/``v_cache`` at ``loc`` only.
    """
    return torch.ops.graphrt.decode_rope_attention(
        q, k, v, cos_sin, loc, k_cache, v_cache, page_table, cache_seqlens, scale, splits, pdl
    )
