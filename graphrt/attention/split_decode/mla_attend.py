"""Single-token dense-MLA decode over the paged RoPE-key and latent caches, split over the keys
(Triton, PDL): the absorbed form FA3 runs with ``qv`` (:mod:`graphrt.attention.fa3_mla`), in one
launch where FA3 takes two (split and combine).

Each query head scores ``(q_rope . k_rope + qv . latent) * scale`` against the one shared latent
KV head (MQA) and reads the latent as its value. Program ``(b, hb, s)``
(:mod:`graphrt.attention.split_decode.mla_kernels`) takes the ``s``-th share of request ``b``'s
keys for head block ``hb`` (``G = min(H, 16)`` heads: V2-Lite's 16 in one block, V3's 128 in 8)
and keeps an online softmax in fp32; the last program holding keys of a (request, head block)
merges its splits (the MHA kernel's merge, :mod:`graphrt.attention.split_decode.launch`). It
reads the lengths before ``gdc_wait()``, ``q_rope``, ``qv`` and the caches after it.

The split count is a function of the bucket and the page table's width only (a graph key): the
MHA kernel's waves of the SMs over ``requests x head blocks`` programs, at most one per
:data:`~graphrt.attention.split_decode.mla_launch.SHARE_N`-key granule of the table and at most
:data:`MAX_SPLITS` (the last program reads every split's ``G x 512`` fp32 state back alone). In a
batch-invariant forward every bucket takes :data:`INVARIANT_SPLITS` (capped by the table only).
The math is the reference backend's (``graphrt.attention.reference`` with ``qv``): fp32 scores
and sums, one rounding of the output.
"""

from __future__ import annotations

import torch

from graphrt.attention.split_decode import mla_launch
from graphrt.attention.split_decode.attend import DTYPES, ENV, PDL_ENV, sms
from graphrt.kernels import tuning
from graphrt.kernels.switches import batch_invariant_on, pdl_enabled, triton_enabled
from graphrt.metadata.base import StepMetadata

#: The (RoPE key, latent) widths the kernel is built and spill-checked for: every DeepSeek-V2/V3.
ROPE_DIM, LATENT_DIM = 64, 512
HEAD_BLOCK = mla_launch.HEAD_BLOCK
#: Splits at most (NOTE: not measured; bounds what the merging program reads back alone).
MAX_SPLITS = 16
#: Splits in a batch-invariant forward, whatever the bucket.
INVARIANT_SPLITS = 16


def enabled(device: torch.device) -> bool:
    """Whether the kernel runs on ``device``: the MHA split decode's switch (:data:`ENV`)."""
    return triton_enabled(ENV, device)


def shape_fits(heads: int, rope_dim: int, latent_dim: int) -> bool:
    """Widths the kernel takes (:data:`ROPE_DIM`, :data:`LATENT_DIM`) and ``heads`` that split into
    whole head blocks: up to :data:`HEAD_BLOCK`, or a multiple of it."""
    whole = heads <= HEAD_BLOCK or heads % HEAD_BLOCK == 0
    return (rope_dim, latent_dim) == (ROPE_DIM, LATENT_DIM) and heads >= 1 and whole


def fits(
    q_rope: torch.Tensor, qv: torch.Tensor, rope_cache: torch.Tensor, latent_cache: torch.Tensor,
    page_table: torch.Tensor,
) -> bool:  # fmt: skip
    """Whether the kernel takes ``q_rope [B, H, 64]`` and ``qv [B, H, 512]`` (unit stride along
    the last dim) over contiguous caches ``[pages, page_size, 1, 64]`` and ``[.., 1, 512]``, all in
    one 16-bit dtype, ``H`` per :func:`shape_fits`."""
    if q_rope.dim() != 3 or qv.dim() != 3 or rope_cache.dim() != 4 or latent_cache.dim() != 4:
        return False
    b, heads, r = q_rope.shape
    return (
        b == page_table.shape[0]
        and tuple(qv.shape[:2]) == (b, heads)
        and shape_fits(heads, r, qv.shape[2])
        and q_rope.dtype in DTYPES
        and all(t.dtype == q_rope.dtype for t in (qv, rope_cache, latent_cache))
        and rope_cache.shape[1:] == (latent_cache.shape[1], 1, r)
        and latent_cache.shape[2:] == (1, qv.shape[2])
        and q_rope.stride(2) == 1
        and qv.stride(2) == 1
        and rope_cache.is_contiguous()
        and latent_cache.is_contiguous()
    )


def num_splits(batch: int, head_blocks: int, keys: int, sms: int) -> int:
    """Splits per (request, head block): the active tuning table's ``decode_waves`` waves of
    ``sms`` programs, at most one per ``SHARE_N``-key granule of the ``keys``-wide page table and
    :data:`MAX_SPLITS`, at least 1."""
    want = -(-tuning.active().decode_waves * sms // (batch * head_blocks))
    return max(1, min(want, MAX_SPLITS, -(-keys // mla_launch.SHARE_N)))


def takes(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: StepMetadata,
    window: int | None = None,
    sinks: torch.Tensor | None = None,
    kv_scales: object = None,
    qv: torch.Tensor | None = None,
) -> bool:
    """One query token per request over its cached keys with ``qv`` (dense MLA: ``q`` the RoPE
    query, ``k_cache`` the RoPE keys, ``v_cache`` the latents), no window, sinks nor FP8 scales,
    no token tree, tensors the kernel fits (:data:`ENV` on): what a backend checks before
    :func:`attend`."""
    b = meta.buffers
    return (
        qv is not None
        and window is None
        and sinks is None
        and kv_scales is None
        and meta.cascade is None
        and meta.max_seqlen_q == 1
        and q.shape[0] == b.cache_seqlens.shape[0]
        and enabled(q.device)
        and fits(q, qv, k_cache, v_cache, b.page_table)
    )


def attend(
    q_rope: torch.Tensor,
    qv: torch.Tensor,
    rope_cache: torch.Tensor,
    latent_cache: torch.Tensor,
    meta: StepMetadata,
    scale: float,
) -> torch.Tensor:
    """The step's single-token MLA attention through the kernel: ``[B, H, 512]`` in ``q_rope``'s
    dtype (the probabilities times the latents)."""
    b = meta.buffers
    keys = b.page_table.shape[1] * meta.page_size
    if batch_invariant_on():  # NOTE: the table's width only, never the bucket
        splits = max(1, min(INVARIANT_SPLITS, -(-keys // mla_launch.SHARE_N)))
    else:
        blocks = q_rope.shape[1] // mla_launch.head_block(q_rope.shape[1])
        splits = num_splits(q_rope.shape[0], blocks, keys, sms(q_rope.device))
    pdl = pdl_enabled(PDL_ENV, q_rope.device)
    return mla_decode_attention(
        q_rope, qv, rope_cache, latent_cache, b.page_table, b.cache_seqlens, scale, splits, pdl
    )


def mla_decode_attention(
    q_rope: torch.Tensor, qv: torch.Tensor, rope_cache: torch.Tensor, latent_cache: torch.Tensor,
    page_table: torch.Tensor, cache_seqlens: torch.Tensor, scale: float, splits: int, pdl: bool = True,
) -> torch.Tensor:  # fmt: skip
    """Absorbed MLA attention of one query token per request over its cached keys.

    ``q_rope [B, H, 64]``, ``qv [B, H, 512]`` (16-bit, unit stride along the last dim), caches
    ``rope_cache [pages, page_size, 1, 64]`` and ``latent_cache [pages, page_size, 1, 512]``,
    ``page_table [B, max_pages]`` int32 page ids, ``cache_seqlens [B]`` int32 keys per request
    (the query is the last), ``splits`` from :func:`num_splits`. Key ``j`` scores ``(q_rope .
    k_rope_j + qv . latent_j) * scale``; the output is ``softmax @ latent``, ``[B, H, 512]`` in
    ``q_rope``'s dtype. Rows with no keys return zeros.
    """
    return torch.ops.graphrt.mla_decode_attention(
        q_rope, qv, rope_cache, latent_cache, page_table, cache_seqlens, scale, splits, pdl
    )
