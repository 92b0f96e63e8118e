"""The launch of the split decode attention (:mod:`graphrt.attention.split_decode.attend`) and the
``torch.ops.graphrt`` op that runs it.

One launch: the last split merges. A row of ``seqlen`` keys gives each split
``per = cdiv(cdiv(seqlen, 64), SPLITS) * 64`` keys, so only the first ``n = cdiv(seqlen, per)``
hold any (0 for a row without keys); the others store nothing. Each of the ``n`` programs
holding keys counts itself on its (request, KV head)'s counter
(:func:`graphrt.kernels.scratch.counters`, left at 0) after storing its state; the last merges
the ``G`` query heads of its KV head at once, ``CHUNK`` splits of every head a step (one L2
round trip for up to ``CHUNK`` splits). A row without keys: program 0 writes its zeros. Why one
launch and not a merge kernel after the split one: fewer launches a step for the same math
(docs/gpu.md has the measurements). Given the new keys (``k_new``, ``v_new``, ``cos_sin``,
``loc``), the launch rotates q and stores the keys too (``ROPE``; the op writes the caches).
"""

from __future__ import annotations

import torch

from graphrt.attention.split_decode import triton_kernels as kernels
from graphrt.kernels import scratch, tuning
from graphrt.kernels.switches import triton

BLOCK_N = 64
# NOTE: warps by head dim (``decode_warps``: at 128 on 4 warps ptxas spills on sm_90) and the fp32
# values of ``acc`` the last program merges a step (``decode_merge_tile``: ``G`` heads x ``CHUNK``
# splits x ``D``) come from the active tuning table (graphrt.kernels.tuning), chosen per GPU.


def decode_attention(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, page_table: torch.Tensor,
    cache_seqlens: torch.Tensor, scale: float, splits: int, pdl: bool, window: int | None = None,
    sinks: torch.Tensor | None = None, k_new: torch.Tensor | None = None, v_new: torch.Tensor | None = None,
    cos_sin: torch.Tensor | None = None, loc: torch.Tensor | None = None, chain: int = 1,
) -> torch.Tensor:  # fmt: skip
    """The split launch, its last program of each (request, KV head) merging; ``window``: keys
    ``seqlen - 1 - window ..`` only; ``sinks [Hq]``: a logit per head joining the denominator;
    ``k_new``, ``v_new``, ``cos_sin``, ``loc`` (all or none): ``q`` and ``k_new`` still to be
    rotated, the rotated ``k_new`` and ``v_new`` stored at ``loc`` by the launch; ``chain``: query
    rows per request (each row a token of its request's chain, the last at its newest key)."""
    assert triton is not None, "decode attention needs Triton"
    b, heads, d = q.shape
    rope = _fresh(k_new, v_new, cos_sin, loc)
    if chain < 1 or b != chain * cache_seqlens.shape[0] or (chain > 1 and rope is not None):
        raise ValueError(
            f"decode_attention: {b} query rows for {cache_seqlens.shape[0]} requests with chain "
            f"{chain} (rows = chain x requests, chain >= 1; new keys only with chain 1)"
        )
    page, heads_k = k_cache.shape[1], k_cache.shape[2]
    group = heads // heads_k
    m = torch.empty((b, heads, splits), dtype=torch.float32, device=q.device)
    l_sum = torch.empty_like(m)
    acc = torch.empty((b, heads, splits, d), dtype=torch.float32, device=q.device)
    out = torch.empty((b, heads, d), dtype=q.dtype, device=q.device)
    arrivals = scratch.counters(b * heads_k, q.device)
    block_s = max(2, triton.next_power_of_2(splits))
    merge_g = max(2, triton.next_power_of_2(group))
    table = tuning.active()
    new = (q, q, q, q) if rope is None else rope  # NOTE: unread without ROPE
    new_strides = [0] * 4 if rope is None else [t.stride(0) for t in rope]
    kernels._decode_split[(b, heads_k, splits)](
        q, k_cache, v_cache, page_table, cache_seqlens, m, l_sum, acc, arrivals, out,
        q if sinks is None else sinks, *new, q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1),
        k_cache.stride(2), page_table.stride(0), out.stride(0), out.stride(1), *new_strides,
        scale * 1.4426950408889634, 0 if window is None else window, PAGE=page, D=d, G=group, BLOCK_G=max(16, triton.next_power_of_2(group)),
        BLOCK_N=BLOCK_N, SPLITS=splits, PDL=pdl, F32_DOT=not q.is_cuda,
        MERGE_G=merge_g, CHUNK=min(block_s, max(1, table.decode_merge_tile // (merge_g * d))),
        WINDOW=window is not None, SINKS=sinks is not None, ROPE=rope is not None, CHAIN=chain,
        num_warps=table.split_warps(d), launch_pdl=pdl,
    )  # fmt: skip
    return out


def _fresh(*tensors: torch.Tensor | None) -> tuple[torch.Tensor, ...] | None:
    """``(k_new, v_new, cos_sin, loc)``, or None when none is given; a clear error for some."""
    given = [t is not None for t in tensors]
    if not any(given):
        return None
    if not all(given):
        raise ValueError(
            "decode_attention rotates and stores the new keys with k_new, v_new, cos_sin and loc "
            f"together; given: {', '.join(n for n, g in zip(('k_new', 'v_new', 'cos_sin', 'loc'), given, strict=True) if g)}"
        )
    return tuple(t for t in tensors if t is not None)


# NOTE: one ``torch.ops.graphrt`` op per launch, so the emulated capture engine records and
# replays it like an aten op; the caches are written when the new keys are given (``a!``, ``b!``).
_LIB = torch.library.Library("graphrt", "FRAGMENT")
_LIB.define(
    "decode_attention(Tensor q, Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor page_table, Tensor cache_seqlens, "
    "float scale, int splits, bool pdl, int? window=None, Tensor? sinks=None, Tensor? k_new=None, "
    "Tensor? v_new=None, Tensor? cos_sin=None, Tensor? loc=None, int chain=1) -> Tensor"
)
_LIB.impl("decode_attention", decode_attention, "CompositeExplicitAutograd")
