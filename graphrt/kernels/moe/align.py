"""Static bounds of the expert alignment (the field's ``moe_align_block_size`` pattern).

Token slots are grouped by expert and each expert's run is padded to a multiple of
:data:`BLOCK_M`, so one program of the grouped GEMM reads one expert's weights. The true padded
length lives on the device; these bounds size the buffers for any routing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from graphrt.kernels.switches import KERNELS_PDL_ENV, pdl_enabled, triton_enabled

if TYPE_CHECKING:
    from graphrt.kernels.moe import Routing

#: The switch of the MoE kernels, the alignment's and the experts' (:func:`graphrt.kernels.switches.
#: triton_enabled`): ``0`` runs the torch references on CUDA too, ``interpret`` the kernels under
#: the interpreter.
ENV = "GRAPHRT_FUSED_MOE"
#: PDL for every MoE kernel: the switch of the other GEMMs.
PDL_ENV = KERNELS_PDL_ENV

#: Rows of one block of the grouped GEMM (each block holds one expert's token slots).
BLOCK_M = 16


def align_bound(tokens: int, topk: int, num_experts: int, block_m: int = BLOCK_M) -> int:
    """Largest length of the aligned slot list: ``tokens * topk`` slots plus, per expert, at most
    ``block_m - 1`` pad slots (never more blocks than slots allow)."""
    slots = tokens * topk
    return slots + min(num_experts, slots) * (block_m - 1)


def block_bound(tokens: int, topk: int, num_experts: int, block_m: int = BLOCK_M) -> int:
    """Blocks of :func:`align_bound` slots."""
    return -(-align_bound(tokens, topk, num_experts, block_m) // block_m)


def check_routing_buffers(topk_ids: torch.Tensor, num_experts: int, routing: Routing) -> None:
    """``ValueError`` naming the value and the limit when ``routing`` cannot hold the alignment of
    ``topk_ids [T, k]`` over ``num_experts`` experts."""
    if topk_ids.dim() != 2 or topk_ids.dtype != torch.int32 or not topk_ids.is_contiguous():
        raise ValueError(
            f"topk_ids must be a contiguous [T, k] int32 tensor, got {tuple(topk_ids.shape)} {topk_ids.dtype}"
        )
    tokens, topk = topk_ids.shape
    need = {
        "sorted_ids": align_bound(tokens, topk, num_experts),
        "block_experts": block_bound(tokens, topk, num_experts),
        "num_padded": 1,
        "expert_counts": num_experts,
    }
    for name, least in need.items():
        buf = getattr(routing, name)
        if buf.dim() != 1 or buf.dtype != torch.int32 or buf.numel() < least or buf.stride(0) != 1:
            raise ValueError(
                f"routing.{name} is {tuple(buf.shape)} {buf.dtype}; the alignment of T={tokens}, "
                f"k={topk}, E={num_experts} needs a contiguous int32 vector of at least {least}"
            )
        if buf.device != topk_ids.device:
            raise ValueError(f"routing.{name} is on {buf.device}, topk_ids on {topk_ids.device}")


def align_reference(topk_ids: torch.Tensor, num_experts: int, routing: Routing) -> None:
    """:func:`moe_align` in torch ops of static shapes (no host sync; the CPU path and the oracle).

    A stable sort by expert keeps each expert's slots in increasing slot order; slots of pad rows
    (id ``num_experts``) and anything past the true length are written the sentinel ``T * k``.
    """
    slots = topk_ids.numel()
    ids = topk_ids.reshape(-1).long().clamp(0, num_experts)  # NOTE: E (a pad row) sorts last
    counts = torch.zeros(num_experts + 1, dtype=torch.long, device=ids.device)
    counts.scatter_add_(0, ids, torch.ones_like(ids))
    counts = counts[:num_experts]
    padded = (counts + BLOCK_M - 1) // BLOCK_M * BLOCK_M
    ends = padded.cumsum(0)
    starts = torch.cat([ends.new_zeros(1), ends[:-1]])
    first = torch.cat([counts.new_zeros(1), counts.cumsum(0)])  # NOTE: sorted position of each run
    key, order = torch.sort(ids, stable=True)
    rank = torch.arange(slots, device=ids.device) - first[key]
    bound = routing.sorted_ids.numel()
    valid = key < num_experts
    dest = torch.where(valid, torch.cat([starts, starts.new_zeros(1)])[key] + rank, bound)
    out = torch.full((bound + 1,), slots, dtype=torch.int32, device=ids.device)
    out.scatter_(0, dest, order.int())  # NOTE: pad rows all land in the dropped last entry
    routing.sorted_ids.copy_(out[:bound])
    block_start = torch.arange(routing.block_experts.numel(), device=ids.device) * BLOCK_M
    expert = torch.searchsorted(ends, block_start, right=True)
    routing.block_experts.copy_(torch.where(expert < num_experts, expert, -1))
    routing.num_padded.copy_(ends[-1:])
    routing.expert_counts[:num_experts].copy_(counts)


def moe_align(topk_ids: torch.Tensor, num_experts: int, routing: Routing) -> None:
    """Group the token slots of ``topk_ids`` by expert, in place in ``routing``'s buffers.

    Parameters
    ----------
    topk_ids : ``[T, k]`` int32, contiguous; ``num_experts`` on pad rows (their slots are dropped).
    num_experts : ``E``, the experts of the layer.
    routing : its ``sorted_ids [>= align_bound(T, k, E)]`` gets, per expert in order, the slots
        ``t * k + j`` routed to it (increasing), each run padded to :data:`BLOCK_M` with the
        sentinel ``T * k`` (also the tail); ``block_experts [>= block_bound(T, k, E)]`` each
        block's expert (-1 past the end); ``num_padded [1]`` the true length; ``expert_counts
        [E]`` the slots per expert (pad rows excluded). All int32, written on the device.

    The Triton kernel on CUDA (or the interpreter, :data:`ENV`), else :func:`align_reference`;
    both give the same buffers, bit for bit.
    """
    check_routing_buffers(topk_ids, num_experts, routing)
    if triton_enabled(ENV, topk_ids.device):
        from graphrt.kernels.moe.align_triton import align_triton

        align_triton(topk_ids, num_experts, routing, BLOCK_M, pdl_enabled(PDL_ENV, topk_ids.device))
    else:
        align_reference(topk_ids, num_experts, routing)
