"""Static bounds of the expert alignment (the field's ``moe_align_block_size`` pattern).

Token slots are grouped by expert and each expert's run is padded to a multiple of
:data:`BLOCK_M`, so one program of the grouped GEMM reads one expert's weights. The true padded
length lives on the device; these bounds size the buffers for any routing.
"""

from __future__ import annotations

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
