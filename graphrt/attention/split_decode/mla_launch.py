"""The launch of the dense-MLA split decode (:mod:`graphrt.attention.split_decode.mla_attend`) and
the ``torch.ops.graphrt`` op that runs it.

One launch, grid ``(B, H // G, splits)``: ``G = min(H, HEAD_BLOCK)`` query heads a program (16 rows
of ``tl.dot``; DeepSeek-V2-Lite's 16 heads in one block, V3's 128 in 8), every block reading the
one latent KV head. The last program holding keys of a (request, head block) merges its ``G``
heads, as the MHA launch (:mod:`graphrt.attention.split_decode.launch`) does for a KV head.
"""

from __future__ import annotations

import torch

from graphrt.attention.split_decode import mla_kernels as kernels
from graphrt.kernels import scratch, tuning
from graphrt.kernels.switches import triton

#: Keys a loop step (the ``[BLOCK_N, 512]`` latent tile read once for both dots).
BLOCK_N = 32
#: Keys of a share's granule: a split walks at least this many. NOTE: the last program reads back
#: ``G x 512`` fp32 (32 KB at 16 heads) per split holding keys; 128 keys of cache are 144 KB.
SHARE_N = 128
#: Query heads a program at most (the rows of its ``tl.dot``).
HEAD_BLOCK = 16
# NOTE: 8 warps: acc [16, 512] fp32 (and the merge's [16, 512] running output) in 32 registers a
# thread; the compile test (tests/attention/test_mla_decode.py) holds ptxas to no spills on sm_90.
WARPS = 8


def head_block(heads: int) -> int:
    """Query heads a program takes: all ``heads`` up to :data:`HEAD_BLOCK`, else that many."""
    return min(heads, HEAD_BLOCK)


def mla_decode_attention(
    q_rope: torch.Tensor, qv: torch.Tensor, rope_cache: torch.Tensor, latent_cache: torch.Tensor,
    page_table: torch.Tensor, cache_seqlens: torch.Tensor, scale: float, splits: int, pdl: bool,
) -> torch.Tensor:  # fmt: skip
    """The split launch, its last program of each (request, head block) merging."""
    assert triton is not None, "MLA decode attention needs Triton"
    b, heads, r = q_rope.shape
    page, d = latent_cache.shape[1], latent_cache.shape[3]
    group = head_block(heads)
    m = torch.empty((b, heads, splits), dtype=torch.float32, device=q_rope.device)
    l_sum = torch.empty_like(m)
    acc = torch.empty((b, heads, splits, d), dtype=torch.float32, device=q_rope.device)
    out = torch.empty((b, heads, d), dtype=q_rope.dtype, device=q_rope.device)
    arrivals = scratch.counters(b * (heads // group), q_rope.device)
    merge_g = max(2, triton.next_power_of_2(group))
    chunk = min(
        max(2, triton.next_power_of_2(splits)), max(1, tuning.active().decode_merge_tile // (merge_g * d))
    )
    kernels._mla_decode_split[(b, heads // group, splits)](
        q_rope, qv, rope_cache, latent_cache, page_table, cache_seqlens, m, l_sum, acc, arrivals, out,
        q_rope.stride(0), q_rope.stride(1), qv.stride(0), qv.stride(1), rope_cache.stride(0),
        rope_cache.stride(1), latent_cache.stride(0), latent_cache.stride(1), page_table.stride(0),
        out.stride(0), out.stride(1), scale * 1.4426950408889634, PAGE=page, R=r, D=d, G=group,
        BLOCK_G=max(16, triton.next_power_of_2(group)), BLOCK_N=BLOCK_N, SHARE_N=SHARE_N, SPLITS=splits,
        PDL=pdl, F32_DOT=not q_rope.is_cuda, MERGE_G=merge_g, CHUNK=chunk, num_warps=WARPS, launch_pdl=pdl,
    )  # fmt: skip
    return out


# NOTE: one ``torch.ops.graphrt`` op per launch, so the emulated capture engine records and
# replays it like an aten op.
_LIB = torch.library.Library("graphrt", "FRAGMENT")
_LIB.define(
    "mla_decode_attention(Tensor q_rope, Tensor qv, Tensor rope_cache, Tensor latent_cache, "
    "Tensor page_table, Tensor cache_seqlens, float scale, int splits, bool pdl) -> Tensor"
)
_LIB.impl("mla_decode_attention", mla_decode_attention, "CompositeExplicitAutograd")
