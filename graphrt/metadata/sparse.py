"""The sparse-MLA buffer group: top-k indices, their KV slots, FlashMLA scratch and schedule.

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
from graphrt.metadata.base import StepMetadata, token_rows

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
    free = PadRule("free")
    # NOTE: q_pad, sched_meta and num_splits are FlashMLA's workspace (the schedule only for the
    # FP8 cache; the torch reference never touches them): debug mode's poison check skips them.
    return (
        BufferSpec("topk_indices", ("max_tokens", index_topk), torch.int32, free),
        BufferSpec("topk_slots", ("max_tokens", width), torch.int32, free),
        BufferSpec("q_pad", ("max_tokens", padded_heads, QK_DIM), torch.bfloat16, free, scratch=True),
        BufferSpec("sched_meta", (sched_rows, SCHED_WIDTH), torch.int32, free, scratch=True),
        BufferSpec("num_splits", ("max_bs+1",), torch.int32, free, scratch=True),
    )


@dataclass(slots=True)
class SparseBuffers:
    """Sparse-MLA tensors of one step (bucket views, or fresh on the eager path).

    ``topk_indices [num_tokens, index_topk]`` int32: positions of the keys the indexer chose,
    on the token's own path (its request's positions; ``prefix + depth`` for a tree ancestor),
    −1 where fewer keys exist. ``topk_slots [num_tokens, >= index_topk]``: the
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


@dataclass(frozen=True, slots=True)
class Candidates:
    """The keys each query token may select, in the order of their positions on its path.

    ``slots [T, C]`` int64 KV slots, ``positions [T, C]`` int64 and ``valid [T, C]`` bool. A
    key's position is where it sits on the token's own root-to-token path: its request
    position for a chain, ``prefix_len + depth`` for a tree ancestor — so a tree token and the
    same token verified as a chain see the same positions in the same column order.
    """

    slots: torch.Tensor
    positions: torch.Tensor
    valid: torch.Tensor


def chain_candidates(table: ReqToToken, rows: torch.Tensor, kv_pos: torch.Tensor) -> Candidates:
    """Causal keys: positions ``0..kv_pos[t]`` of row ``rows[t]`` of ``req_to_token``."""
    slots = table.table[rows].long()  # [T, max_context_len]
    keys = torch.arange(slots.shape[1], device=slots.device).expand_as(slots)
    return Candidates(slots, keys, keys <= kv_pos[:, None])


def tree_candidates(
    table: ReqToToken,
    rows: torch.Tensor,
    prefix: torch.Tensor,
    expand: torch.Tensor,
    expand_lens: torch.Tensor,
) -> Candidates:
    """Tree keys: the committed prefix, then the token's own ancestors-or-self.

    ``prefix [T]``: committed keys of each token's request (positions ``0..prefix-1`` of its
    ``req_to_token`` row); ``expand [T, E]`` int: the KV slots of the token's ancestors and
    itself in depth order, the first ``expand_lens[t]`` valid (the cascade group's expand
    lists). Siblings and cousins, although at nearby positions of the row, are never keys.
    """
    chain = chain_candidates(table, rows, prefix - 1)
    depth = torch.arange(expand.shape[1], device=expand.device)
    return Candidates(
        torch.cat((chain.slots, expand.long()), dim=1),
        torch.cat((chain.positions, prefix.long()[:, None] + depth[None, :]), dim=1),
        torch.cat((chain.valid, depth[None, :] < expand_lens.long()[:, None]), dim=1),
    )


def step_candidates(meta: StepMetadata, table: ReqToToken) -> Candidates:
    """The candidate keys of every query token of one step (device ops only, graph-safe).

    Chains (DECODE, chain TARGET_VERIFY / DRAFT_DECODE, DRAFT_EXTEND) take causal keys of the
    token's row. A token tree (``meta.cascade``: TARGET_VERIFY from ``Batch.tree_mask``, or
    DRAFT_DECODE step ``i`` from each branch's draft slots ``0..i``) takes the prefix plus the
    token's expand list. Ragged-tail rows read position 0 of the dummy request.
    """
    rows, kv_pos = token_rows(meta.buffers, table.dummy_req)
    cascade = meta.cascade
    if cascade is None:
        return chain_candidates(table, rows, kv_pos)
    prefix = cascade.prefix_seqlens[meta.buffers.req_id_per_token]
    return tree_candidates(table, rows, prefix, cascade.expand_table, cascade.expand_seqlens)


def select_topk(scores: torch.Tensor, keys: Candidates, out: SparseBuffers) -> None:
    """Keep the ``index_topk`` best candidate keys per query token, in place.

    ``scores [T, C]`` float32 over ``keys``' columns; invalid columns never win. Writes
    ``out.topk_indices`` (the keys' positions, −1 where fewer than ``index_topk`` keys exist)
    and ``out.topk_slots`` (their KV slots, −1 likewise; columns past ``index_topk`` −1).
    Ties go to the earlier column (a stable sort), so selection never depends on the kernel's
    tie order. Graph-safe: no host sync.
    """
    k = out.topk_indices.shape[1]
    # NOTE: + 0.0 turns -0.0 into 0.0: the relu'd scores tie at exactly zero, and a radix sort
    # would order the two zeros by their sign bit.
    scores = torch.where(keys.valid, scores + 0.0, float("-inf"))
    slots, positions = keys.slots, keys.positions
    if scores.shape[1] < k:
        # NOTE: a context shorter than index_topk still yields index_topk columns (−1 tails).
        pad = (0, k - scores.shape[1])
        scores = torch.nn.functional.pad(scores, pad, value=float("-inf"))
        slots, positions = (torch.nn.functional.pad(x, pad, value=-1) for x in (slots, positions))
    values, index = torch.sort(scores, dim=-1, descending=True, stable=True)
    found = values[:, :k] != float("-inf")
    index = index[:, :k]
    out.topk_indices.copy_(torch.where(found, positions.gather(1, index), -1))
    out.topk_slots[:, :k].copy_(torch.where(found, slots.gather(1, index), -1))
    if out.topk_slots.shape[1] > k:
        out.topk_slots[:, k:].fill_(-1)
