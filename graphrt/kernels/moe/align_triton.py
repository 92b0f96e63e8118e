"""The expert alignment as one Triton program (:func:`graphrt.kernels.moe.align.moe_align`).

One program walks the ``T * k`` slots in chunks twice: first a histogram per expert (a
``[chunk, E]`` one-hot summed over the chunk), then, with each expert's padded start from a
prefix sum, each slot's destination (its expert's start, the slots of its expert in earlier
chunks, and its rank in this chunk from a cumulative sum of the one-hot). The order within an
expert is the slot order, so the result is deterministic and equals the torch reference bit for
bit. One program is enough for decode and verify steps (``T * k`` up to a few thousand): its cost
grows with ``T * k * E / chunk`` steps, not with launches.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from graphrt.kernels.switches import tl, triton

if TYPE_CHECKING:
    from graphrt.kernels.moe import Routing

#: One-hot entries of a chunk (``chunk * E``): the chunk shrinks as ``E`` grows.
CHUNK_CELLS = 4096
#: Sentinel entries one fill step writes.
FILL = 1024


def align_triton(topk_ids: torch.Tensor, num_experts: int, routing: Routing, block_m: int, pdl: bool) -> None:
    """Launch the alignment program, runs padded to ``block_m`` (buffers already checked by
    ``moe_align``)."""
    assert triton is not None, "the MoE alignment kernel needs Triton"
    block_e = triton.next_power_of_2(num_experts)
    chunk = max(16, CHUNK_CELLS // block_e)
    _align[(1,)](
        topk_ids, routing.sorted_ids, routing.block_experts, routing.num_padded, routing.expert_counts,
        topk_ids.numel(), num_experts, routing.sorted_ids.numel(), routing.block_experts.numel(),
        BLOCK_E=block_e, CHUNK=chunk, FILL=FILL, BM=block_m, PDL=pdl, num_warps=4, launch_pdl=pdl,
    )  # fmt: skip


if triton is not None:

    @triton.jit
    def _onehot(ids, s0, rc, re, S, E):
        """``[chunk, E]`` int32: slot ``s0 + i`` routed to expert ``e`` (pad rows and the tail: none)."""
        e = tl.load(ids + s0 + rc, mask=s0 + rc < S, other=E)
        return ((e[:, None] == re[None, :]) & (re[None, :] < E)).to(tl.int32)

    @triton.jit
    def _align(
        ids, sorted_ids, block_experts, num_padded, expert_counts, S, E, BOUND, NBLOCKS,
        BLOCK_E: tl.constexpr, CHUNK: tl.constexpr, FILL: tl.constexpr, BM: tl.constexpr,
        PDL: tl.constexpr,
    ):  # fmt: skip
        if PDL:
            tl.extra.cuda.gdc_wait()  # NOTE: topk_ids is the router's output
            tl.extra.cuda.gdc_launch_dependents()
        re = tl.arange(0, BLOCK_E)
        rc = tl.arange(0, CHUNK)
        rf = tl.arange(0, FILL)
        for p0 in range(0, BOUND, FILL):
            tl.store(sorted_ids + p0 + rf, tl.zeros((FILL,), tl.int32) + S, mask=p0 + rf < BOUND)
        counts = tl.zeros((BLOCK_E,), tl.int32)
        for s0 in range(0, S, CHUNK):
            counts += tl.sum(_onehot(ids, s0, rc, re, S, E), axis=0)
        padded = (counts + BM - 1) // BM * BM
        ends = tl.cumsum(padded, axis=0)
        total = tl.sum(padded, axis=0)
        tl.store(expert_counts + re, counts, mask=re < E)
        tl.store(num_padded, total)
        tl.debug_barrier()  # NOTE: the sentinel fill lands before the scatter overwrites it
        running = ends - padded
        for s0 in range(0, S, CHUNK):
            hit = _onehot(ids, s0, rc, re, S, E)
            before = tl.cumsum(hit, axis=0) - hit
            dest = tl.sum(hit * (before + running[None, :]), axis=1)
            tl.store(sorted_ids + dest, s0 + rc, mask=tl.sum(hit, axis=1) > 0)
            running += tl.sum(hit, axis=0)
        for b0 in range(0, NBLOCKS, CHUNK):
            start = (b0 + rc) * BM
            past = (ends[None, :] <= start[:, None]) & (re[None, :] < E)
            expert = tl.where(start < total, tl.sum(past.to(tl.int32), axis=1), -1)
            tl.store(block_experts + b0 + rc, expert, mask=b0 + rc < NBLOCKS)
