"""The sparse-MLA buffer family: top-k indices, their KV slots, FlashMLA scratch and schedule.

Every buffer here is derived on the device inside the forward (hence inside the graph): the
indexer writes ``topk_indices`` and ``topk_slots`` per layer, the FlashMLA backend copies the
query into the head-padded ``q_pad`` and plans ``sched_meta`` / ``num_splits`` once per step.
Nothing is host-written, so the step's single host→device copy is unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from graphrt.buffers import BufferSpec, Dims, PadRule
from graphrt.kv import ReqToToken
from graphrt.kv.mla import QK_DIM

#: Rows of FlashMLA's tile-scheduler metadata buffer: at least one part per SM of any GPU.
MAX_SM_PARTS = 256
#: Width of one tile-scheduler row (``TileSchedulerMetaDataSize`` in FlashMLA).
SCHED_WIDTH = 8


def sparse_specs(index_topk: int, padded_heads: int, slot_multiple: int = 1) -> tuple[BufferSpec, ...]:
    """Specs for ``index_topk`` keys per query token.

    ``topk_slots`` is ``index_topk`` rounded up to ``slot_multiple`` wide (FlashMLA's SM90
    sparse prefill kernel needs a multiple of 128); the extra columns always hold −1.

    ``padded_heads`` is the FlashMLA head count (64 or 128); 0 (the torch reference) sizes
    the FlashMLA scratch and schedule buffers to zero bytes.
    """
    sched_rows = MAX_SM_PARTS if padded_heads else 0
    width = -(-index_topk // slot_multiple) * slot_multiple
    return (
        BufferSpec("topk_indices", ("max_tokens", index_topk), torch.int32, PadRule("free")),
        BufferSpec("topk_slots", ("max_tokens", width), torch.int32, PadRule("free")),
        BufferSpec("q_pad", ("max_tokens", padded_heads, QK_DIM), torch.bfloat16, PadRule("free")),
        BufferSpec("sched_meta", (sched_rows, SCHED_WIDTH), torch.int32, PadRule("free")),
        BufferSpec("num_splits", ("max_bs+1",), torch.int32, PadRule("free")),
    )


@dataclass(slots=True)
class SparseBuffers:
    """Sparse-MLA tensors of one step (bucket views, or fresh on the eager path).

    ``topk_indices [num_tokens, index_topk]`` int32: positions in the token's request chosen
    by the indexer, −1 where fewer keys exist. ``topk_slots [num_tokens, >= index_topk]``: the
    same as global KV slots (−1 stays −1; columns past ``index_topk`` are −1). FlashMLA only: ``q_pad [num_tokens, padded_heads, 576]`` bfloat16,
    ``sched_meta [MAX_SM_PARTS, 8]`` and ``num_splits [bs + 1]`` int32.
    """

    topk_indices: torch.Tensor
    topk_slots: torch.Tensor
    q_pad: torch.Tensor
    sched_meta: torch.Tensor
    num_splits: torch.Tensor


def fresh_sparse(
    specs: tuple[BufferSpec, ...], rows: int, tokens: int, device: torch.device
) -> SparseBuffers:
    """Exact-size sparse buffers for the eager path (zeros: the q padding heads must be 0)."""
    dims = Dims(rows, tokens, 0, 0)
    return SparseBuffers(**{s.name: torch.zeros(s.size(dims), dtype=s.dtype, device=device) for s in specs})


def select_topk(
    scores: torch.Tensor, kv_pos: torch.Tensor, out: SparseBuffers, rows: torch.Tensor, table: ReqToToken
) -> None:
    """Keep the ``index_topk`` best keys per query token, in place, then map them to slots.

    ``scores [num_tokens, width]`` float32 over request positions ``0..width-1``; keys after a
    token's own position are masked (causal, hence also ``>= seq_len``). Writes
    ``out.topk_indices`` (−1 where fewer than ``index_topk`` keys exist) and
    ``out.topk_slots = req_to_token[row, index]`` (−1 stays −1). Graph-safe: no host sync.
    """
    k = out.topk_indices.shape[1]
    keys = torch.arange(scores.shape[1], device=scores.device)
    scores = scores.masked_fill(keys[None, :] > kv_pos[:, None], float("-inf"))
    if scores.shape[1] < k:
        # NOTE: a context shorter than index_topk still yields index_topk columns (−1 tails).
        scores = torch.nn.functional.pad(scores, (0, k - scores.shape[1]), value=float("-inf"))
    values, index = torch.topk(scores, k, dim=-1)
    index = torch.where(values == float("-inf"), -1, index)
    out.topk_indices.copy_(index)
    slots = table.table[rows[:, None], index.clamp(0, table.max_context_len - 1)]
    out.topk_slots[:, :k].copy_(torch.where(index < 0, -1, slots))
    if out.topk_slots.shape[1] > k:
        out.topk_slots[:, k:].fill_(-1)
