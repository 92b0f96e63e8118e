"""The launches of the split decode attention (:mod:`graphrt.attention.split_decode.attend`) and the
``torch.ops.graphrt`` ops that run them; which merge runs.

Two merges, chosen by a switch read at each launch (a graph keeps the one it was captured with):

- the last split merges (default; ``GRAPHRT_DECODE_MERGE_LAST=0`` turns it off): one launch. A
  row of ``seqlen`` keys gives each split ``per = cdiv(cdiv(seqlen, 64), SPLITS) * 64`` keys, so
  only the first ``n = cdiv(seqlen, per)`` hold any (0 for a row without keys; at 512 keys on a
  4k-wide table the 1B's 33 splits hold 8); the others store nothing. Each of the ``n`` programs
  holding keys counts itself on its (request, KV head)'s counter
  (:func:`graphrt.kernels.scratch.counters`, left at 0) after storing its state; the last merges
  the ``G`` query heads of its KV head at once, ``CHUNK`` splits of every head a step (one L2
  round trip for up to ``CHUNK`` splits; sums in another order: equal to the merge launch's to
  fp32 rounding). A row without keys: program 0 writes its zeros.
- the merge launch (``GRAPHRT_DECODE_MERGE_LAST=0``): all ``SPLITS`` programs of a (request, KV
  head) store a state, even those whose share holds no keys, and ``_decode_merge`` (a second
  launch) reads all of them.

On by default since the H100 (``bench/results/h100/session-1127e``, bs 1, context 512):
Llama-3.2-1B's step 121 -> 105 launches, span 1135..1144 -> 1104 / 1116 µs, busy 1060 -> 1037 µs;
the 8B shape's busy 5702 -> 5736 / 5747 µs, but ``run()``'s p50 5949..5998 -> 5846 / 5886 µs;
SmolLM2's engine 1978 -> 2051 tok/s. (A first version, all ``SPLITS`` counted and heads merged
one at a time, was slower: 1B 1049 -> 1075 µs busy.)
"""

from __future__ import annotations

import os

import torch

from graphrt.attention.split_decode import triton_kernels as kernels
from graphrt.kernels import scratch
from graphrt.kernels.switches import triton

#: ``GRAPHRT_DECODE_MERGE_LAST``: ``1`` (default) lets the last split program holding keys merge
#: (one launch); ``0`` merges in a second launch.
MERGE_LAST_ENV = "GRAPHRT_DECODE_MERGE_LAST"
BLOCK_N = 64
#: Warps of a split program by head dim. NOTE: at 128 on 4 warps ptxas (sm_90) spills 88 bytes
#: a thread (296 with RoPE folded in); on 8 none (220 / 254 registers).
SPLIT_WARPS = {64: 4, 128: 8, 256: 8}
#: fp32 values of ``acc`` the last program merges a step (``G`` heads x ``CHUNK`` splits x ``D``).
MERGE_TILE = 4096


def merge_last() -> bool:
    """Whether the last split program holding keys merges (:data:`MERGE_LAST_ENV` is not ``0``)."""
    return os.environ.get(MERGE_LAST_ENV, "1") != "0"


def decode_attention(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, page_table: torch.Tensor,
    cache_seqlens: torch.Tensor, scale: float, splits: int, pdl: bool,
) -> torch.Tensor:  # fmt: skip
    # NOTE: without RoPE the new-token arguments are never read: q and the lengths stand in
    return _launch(
        q, (q, q, q, cache_seqlens), k_cache, v_cache, page_table, cache_seqlens, scale, splits, pdl, False
    )


def decode_rope_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cos_sin: torch.Tensor, loc: torch.Tensor,
    k_cache: torch.Tensor, v_cache: torch.Tensor, page_table: torch.Tensor, cache_seqlens: torch.Tensor,
    scale: float, splits: int, pdl: bool,
) -> torch.Tensor:  # fmt: skip
    new = (k, v, cos_sin, loc)
    return _launch(q, new, k_cache, v_cache, page_table, cache_seqlens, scale, splits, pdl, True)


def _launch(
    q: torch.Tensor, new: tuple[torch.Tensor, ...], k_cache: torch.Tensor, v_cache: torch.Tensor,
    page_table: torch.Tensor, cache_seqlens: torch.Tensor, scale: float, splits: int, pdl: bool, rope: bool,
) -> torch.Tensor:  # fmt: skip
    """The split launch, then the merge launch unless the last split merges (:func:`merge_last`);
    ``new``: ``(k, v, cos_sin, loc)`` of the new tokens."""
    assert triton is not None, "decode attention needs Triton"
    b, heads, d = q.shape
    page, heads_k = k_cache.shape[1], k_cache.shape[2]
    group = heads // heads_k
    last = merge_last()
    m = torch.empty((b, heads, splits), dtype=torch.float32, device=q.device)
    l_sum = torch.empty_like(m)
    acc = torch.empty((b, heads, splits, d), dtype=torch.float32, device=q.device)
    out = torch.empty((b, heads, d), dtype=q.dtype, device=q.device)
    k, v, cos_sin, loc = new
    arrivals = scratch.counters(b * heads_k, q.device) if last else cache_seqlens
    block_s = max(2, triton.next_power_of_2(splits))
    merge_g = max(2, triton.next_power_of_2(group))
    kernels._decode_split[(b, heads_k, splits)](
        q, k_cache, v_cache, page_table, cache_seqlens, m, l_sum, acc, k, v, cos_sin, loc, arrivals, out,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        page_table.stride(0), k.stride(0) if rope else 0, v.stride(0) if rope else 0,
        cos_sin.stride(0) if rope else 0, loc.stride(0) if rope else 0, out.stride(0), out.stride(1),
        scale * 1.4426950408889634, PAGE=page, D=d, G=group, BLOCK_G=max(16, triton.next_power_of_2(group)),
        BLOCK_N=BLOCK_N, SPLITS=splits, PDL=pdl, ROPE=rope, F32_DOT=not q.is_cuda, LAST_MERGES=last,
        MERGE_G=merge_g, CHUNK=min(block_s, max(1, MERGE_TILE // (merge_g * d))),
        num_warps=SPLIT_WARPS[d], launch_pdl=pdl,
    )  # fmt: skip
    if not last:
        kernels._decode_merge[(b, heads)](
            m, l_sum, acc, out, out.stride(0), out.stride(1), D=d, SPLITS=splits, BLOCK_S=block_s, PDL=pdl,
            num_warps=4, launch_pdl=pdl,
        )  # fmt: skip
    return out


# NOTE: one ``torch.ops.graphrt`` op per split launch and its merge, so the emulated capture
# engine records and replays it like an aten op; the RoPE variant declares the caches it writes.
_LIB = torch.library.Library("graphrt", "FRAGMENT")
_LIB.define(
    "decode_attention(Tensor q, Tensor k_cache, Tensor v_cache, Tensor page_table, Tensor cache_seqlens, "
    "float scale, int splits, bool pdl) -> Tensor"
)
_LIB.impl("decode_attention", decode_attention, "CompositeExplicitAutograd")
_LIB.define(
    "decode_rope_attention(Tensor q, Tensor k, Tensor v, Tensor cos_sin, Tensor loc, Tensor(a!) k_cache, "
    "Tensor(b!) v_cache, Tensor page_table, Tensor cache_seqlens, float scale, int splits, bool pdl) -> Tensor"
)
_LIB.impl("decode_rope_attention", decode_rope_attention, "CompositeExplicitAutograd")
