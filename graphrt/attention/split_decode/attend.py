"""Single-token decode attention over the paged KV cache, split over the keys (Triton, PDL).

At a small batch FA3's decode call runs one CTA per (request, KV head) over every key, so a bs-1
step leaves most SMs idle. This kernel splits each (request, KV head) over the keys so the step
fills the GPU, and the last split program of each (request, KV head) merges the splits
(docs/gpu.md has the measurements that chose it):

- ``_decode_split``: program ``(b, h_k, s)`` takes the ``s``-th share of request ``b``'s
  ``BLOCK_N``-key blocks (``cache_seqlens[b]`` keys, pages from ``page_table[b]``), scores the
  ``G`` query heads of KV head ``h_k`` with ``tl.dot`` (``G`` padded to 16 rows), and keeps an
  online softmax in fp32: its running max ``m``, denominator ``l`` and ``acc = sum p v``. It
  reads the lengths before ``gdc_wait()`` (written long before the layer), ``q`` and the cache
  after it (the previous kernel stores this step's k and v).
- RoPE and the KV store fused in (:func:`fuses_store`; the backend's ``fuses_store``): at a
  step it takes whose layer passes ``rope=``, the kernel gets the unrotated ``q``, the new k
  and v (views of the projection), the step's ``cos_sin`` and ``loc`` in place of a
  ``rope_store`` launch before it: each program rotates its query heads in fp32 (NeoX halves,
  ``rope_store``'s expressions, rounded once), and the one holding the request's newest key
  rotates that key of its KV head and stores it and the value at ``loc[b]`` before its key
  loop (the cache then holds ``rope_store``'s bits). It reads ``cos_sin`` and ``loc`` before
  ``gdc_wait()`` too, the new k and v after it.
- the merge: per (request, query head), the splits' states weighted by ``exp(m_s - M)``,
  divided once; a request with no keys (a pad row) gets zeros. The last program holding keys of
  a (request, KV head) merges its ``G`` heads at the end of the split launch (one launch;
  ``decode_launch`` says how).

The split count is a function of the bucket and the page table's width only (a graph key):
enough programs for two waves of the SMs, never more splits than key blocks. In a
batch-invariant forward (``RuntimeConfig.deterministic``) every bucket takes this kernel with
:data:`INVARIANT_SPLITS` (capped by the key blocks: the table's width only), so a row's
reduction order does not depend on its batch. The math is the
reference backend's (``graphrt.attention.reference``): fp32 scores and sums, one rounding of the
output; the order of the sums differs from FA3's, so the two agree to bf16 rounding.
"""

from __future__ import annotations

import torch

from graphrt.attention.call import FreshKV
from graphrt.attention.fa3_plan import sm_count
from graphrt.attention.split_decode import launch as decode_launch
from graphrt.kernels import switches, tuning
from graphrt.kernels.switches import (  # noqa: F401
    KERNELS_PDL_ENV,
    batch_invariant_on,
    pdl_enabled,
    triton,
    triton_enabled,
)
from graphrt.kv import rope_store
from graphrt.metadata.base import StepMetadata
from graphrt.step.modes import ForwardMode

#: ``GRAPHRT_DECODE_ATTENTION``: ``1`` (default) runs single-token decode through this kernel
#: where it applies, ``0`` keeps FA3's call.
ENV = "GRAPHRT_DECODE_ATTENTION"
#: Its PDL switch, the GEMMs' (:data:`graphrt.kernels.switches.KERNELS_PDL_ENV`).
PDL_ENV = KERNELS_PDL_ENV
DTYPES = (torch.bfloat16, torch.float16)
#: Head dims the kernel takes (powers of two: ``tl.arange`` over the head).
HEAD_DIMS = (64, 128, 256)
MAX_GROUP = 16
#: Splits per (request, KV head) in a batch-invariant forward, whatever the bucket.
INVARIANT_SPLITS = 16
#: Modes whose steps give every request the same chain of query tokens (:func:`chain_of`).
CHAIN_MODES = frozenset({ForwardMode.DECODE, ForwardMode.TARGET_VERIFY})
BLOCK_N = decode_launch.BLOCK_N
#: The SMs the split count assumes under Triton's interpreter (the CPU has none): a few splits.
INTERPRETER_SMS = 4


def enabled(device: torch.device) -> bool:
    """Whether the kernel runs on ``device`` (:data:`ENV`: CUDA with Triton, or the CPU under
    Triton's interpreter with ``ENV=interpret``)."""
    return triton_enabled(ENV, device)


def fits(q: torch.Tensor, k_cache: torch.Tensor, page_table: torch.Tensor, chain: int = 1) -> bool:
    """Whether the kernel takes query rows ``q [B * chain, Hq, D]`` of ``B`` requests over a cache
    ``[pages, page_size, Hk, D]`` in ``q``'s dtype (16-bit), ``D`` in :data:`HEAD_DIMS`."""
    if q.dim() != 3 or k_cache.dim() != 4:
        return False
    heads, d = q.shape[1], q.shape[2]
    return (
        q.shape[0] == chain * page_table.shape[0]
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
    """Splits per (request, KV head): the active tuning table's ``decode_waves`` (two on the
    H100) waves of ``sms`` programs, at most one per key block of the ``keys``-wide page table,
    at least 1."""
    want = -(-tuning.active().decode_waves * sms // (batch * heads_k))
    return max(1, min(want, -(-keys // BLOCK_N)))


def chain_of(q: torch.Tensor, meta: StepMetadata) -> int:
    """Query rows per request when every request of the step has the same chain of them, the
    last at its newest key: 1 for a decode step, the verify length for a TARGET_VERIFY chain
    (a uniform mode without a token tree); 0 for any other step."""
    requests, q_len = meta.buffers.cache_seqlens.shape[0], meta.max_seqlen_q
    uniform = q_len == 1 or (meta.mode in CHAIN_MODES and meta.cascade is None)
    return q_len if uniform and q.shape[0] == requests * q_len else 0


def takes(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    meta: StepMetadata,
    window: int | None = None,
    sinks: torch.Tensor | None = None,
    kv_scales: object = None,
    qv: object = None,
) -> bool:
    """One query token per request, or a verify chain of them (:func:`chain_of`), over its
    cached keys (all, or a sliding ``window``'s), with or without ``sinks`` (a contiguous
    ``[Hq]``), no FP8 scales nor ``qv``, and tensors this kernel takes (:data:`ENV` on): what a
    backend checks before :func:`attend`."""
    chain = chain_of(q, meta)
    return (
        kv_scales is None
        and qv is None
        and (window is None or window >= 0)
        and (sinks is None or (tuple(sinks.shape) == (q.shape[1],) and sinks.is_contiguous()))
        and meta.cascade is None
        and chain > 0
        and enabled(q.device)
        and fits(q, k_cache, meta.buffers.page_table, chain)
    )


def fuses_store(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, fresh: FreshKV, meta: StepMetadata
) -> bool:
    """Whether the kernel, taking this step (:func:`takes`), also rotates ``q`` and stores
    ``fresh`` in place of :func:`~graphrt.kv.rope_store.rope_store` (its switch not ``0``):
    one new token per request (a chain's rows read each other's new keys, so it stores them
    first), tensors ``rope_store``'s kernel takes (:func:`rope_store.fits`:
    packed heads, one 16-bit dtype), both caches in it."""
    b, heads_k, d = q.shape[0], k_cache.shape[2], q.shape[2]
    return (
        switches.active()[rope_store.ENV] != "0"
        and chain_of(q, meta) == 1
        and tuple(fresh.k.shape) == tuple(fresh.v.shape) == (b, heads_k, d)
        and tuple(fresh.cos_sin.shape) == (b, d)
        and tuple(fresh.loc.shape) == (b,)
        and fresh.loc.dtype == torch.int64
        and rope_store.fits(q, fresh.k, fresh.v, fresh.cos_sin, k_cache)
        and v_cache.dtype == k_cache.dtype == q.dtype
        and v_cache.shape == k_cache.shape
        and v_cache.is_contiguous()
    )


def attend(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: StepMetadata,
    scale: float,
    window: int | None = None,
    sinks: torch.Tensor | None = None,
    fresh: FreshKV | None = None,
) -> torch.Tensor:
    """The step's single-token attention through the split decode kernel; with ``fresh``
    (:func:`fuses_store`) ``q`` is rotated by the kernel, which stores the step's new keys and
    values first."""
    b = meta.buffers
    splits, pdl = _split_plan(q, k_cache, meta)
    new = (None,) * 4 if fresh is None else (fresh.k, fresh.v, fresh.cos_sin, fresh.loc)
    return decode_attention(
        q, k_cache, v_cache, b.page_table, b.cache_seqlens, scale, splits, pdl, window, sinks, *new,
        chain=chain_of(q, meta),
    )  # fmt: skip


def _split_plan(q: torch.Tensor, k_cache: torch.Tensor, meta: StepMetadata) -> tuple[int, bool]:
    """The step's split count (a function of the bucket and the page table's width: a graph
    key) and whether it launches with PDL."""
    keys = meta.buffers.page_table.shape[1] * meta.page_size
    if batch_invariant_on():  # NOTE: the table's width only, never the bucket
        splits = max(1, min(INVARIANT_SPLITS, -(-keys // BLOCK_N)))
    else:
        splits = num_splits(q.shape[0], k_cache.shape[2], keys, sms(q.device))
    return splits, pdl_enabled(PDL_ENV, q.device)


def sms(device: torch.device) -> int:
    """The SMs the split count fills: the GPU's, or :data:`INTERPRETER_SMS` on the CPU."""
    return sm_count(device) if device.type == "cuda" else INTERPRETER_SMS


def decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    page_table: torch.Tensor,
    cache_seqlens: torch.Tensor,
    scale: float,
    splits: int,
    pdl: bool = True,
    window: int | None = None,
    sinks: torch.Tensor | None = None,
    k_new: torch.Tensor | None = None,
    v_new: torch.Tensor | None = None,
    cos_sin: torch.Tensor | None = None,
    loc: torch.Tensor | None = None,
    chain: int = 1,
) -> torch.Tensor:
    """Attention of one query token per request (or a chain of ``chain`` per request) over its
    cached keys.

    ``q [B, Hq, D]`` (16-bit, unit stride along ``D``), caches ``[pages, page_size, Hk, D]``,
    ``page_table [B, max_pages]`` int32 page ids, ``cache_seqlens [B]`` int32 keys per request
    (the query is the last), ``splits`` from :func:`num_splits`; ``window``: the query at position
    ``p`` sees keys ``p - window .. p`` only; ``sinks [Hq]``: a logit per head joining the softmax
    denominator (as FA3 takes them). Returns ``[B, Hq, D]`` in ``q``'s dtype. Rows with no keys
    return zeros.

    With ``k_new``/``v_new [B, Hk, D]`` (packed heads, any token stride), ``cos_sin [B, D]`` and
    ``loc [B]`` int64 (all four or none): ``q`` and ``k_new`` are not rotated yet; the kernel
    rotates them (NeoX halves, as ``rope_store``) and stores the rotated ``k_new`` and ``v_new``
    at slots ``loc`` (each request's newest key, position ``cache_seqlens[b] - 1``) before it
    reads them: the caches afterwards hold what ``rope_store`` writes.

    ``chain > 1`` (no new keys: store them first): ``q [B * chain, Hq, D]``, row ``i`` query token
    ``i % chain`` of request ``i // chain``, the last at position ``cache_seqlens[b] - 1``; each
    row sees its request's keys up to its own position (a speculative verify chain).
    """
    return torch.ops.graphrt.decode_attention(
        q, k_cache, v_cache, page_table, cache_seqlens, scale, splits, pdl, window, sinks,
        k_new, v_new, cos_sin, loc, chain,
    )  # fmt: skip
