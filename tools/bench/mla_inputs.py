"""Synthetic sparse-MLA inputs (slot sets with −1 tails, uniform step metadata) for the
FlashMLA bench and the kernel tests."""

from __future__ import annotations

import torch

from graphrt.metadata import StepBuffers, StepMetadata
from graphrt.metadata.sparse import SparseBuffers, fresh_sparse, sparse_specs
from graphrt.step.modes import ForwardMode


def random_slots(
    tokens: int, topk: int, num_slots: int, lens: list[int], device: torch.device
) -> torch.Tensor:
    """``[tokens, topk]`` int32: token ``t`` selects ``lens[t]`` distinct slots, then −1."""
    gen = torch.Generator().manual_seed(2)
    out = torch.full((tokens, topk), -1, dtype=torch.int32)
    for t, n in enumerate(lens):
        out[t, :n] = torch.randperm(num_slots, generator=gen)[:n].int()
    return out.to(device)


def decode_meta(bs: int, q_len: int, device: torch.device) -> StepMetadata:
    """Uniform step metadata for ``bs`` requests of ``q_len`` tokens (what plans read)."""
    tokens = bs * q_len
    zeros = torch.zeros(tokens, dtype=torch.int64, device=device)
    buffers = StepBuffers(
        input_ids=zeros,
        positions=zeros,
        out_cache_loc=zeros,
        req_id_per_token=torch.arange(bs, device=device).repeat_interleave(q_len),
        req_pool_indices=torch.zeros(bs, dtype=torch.int64, device=device),
        cache_seqlens=torch.full((bs,), 64, dtype=torch.int32, device=device),
        cu_seqlens_q=torch.arange(0, tokens + 1, q_len, dtype=torch.int32, device=device),
        page_bound=torch.full((bs,), 8, dtype=torch.int32, device=device),
        page_table=torch.zeros(bs, 8, dtype=torch.int32, device=device),
    )
    mode = ForwardMode.DECODE if q_len == 1 else ForwardMode.TARGET_VERIFY
    return StepMetadata(mode, buffers, max_seqlen_q=q_len, page_size=16)


def sparse_for(slots: torch.Tensor, padded_heads: int, bs: int) -> SparseBuffers:
    """Fresh sparse buffers holding ``slots`` as every token's selected KV slots."""
    tokens, topk = slots.shape
    sparse = fresh_sparse(sparse_specs(topk, padded_heads), bs, tokens, slots.device)
    sparse.topk_slots.copy_(slots)
    return sparse
