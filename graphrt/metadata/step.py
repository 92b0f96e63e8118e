"""The step-metadata buffer family and the two halves of every update.

``write_host`` fills the host-written buffers (real rows, then pad rows per DESIGN rule 3);
``derive`` runs on the device — inside the captured graph on the graph path — and records
the step's KV slots in ``req_to_token`` before gathering the page table from it. The eager
path calls the same two functions on fresh, exact-size arrays.
"""

from __future__ import annotations

import numpy as np
import torch

from graphrt.buffers import BufferSpec, PadRule
from graphrt.kv import ReqToToken
from graphrt.metadata.base import StepBuffers, token_rows
from graphrt.step.batch import Batch

STEP_SPECS = (
    BufferSpec("input_ids", ("max_tokens",), torch.int64, PadRule("const", 0), host=True),
    BufferSpec("positions", ("max_tokens",), torch.int64, PadRule("const", 0), host=True),
    BufferSpec("out_cache_loc", ("max_tokens",), torch.int64, PadRule("const", "dummy_slot"), host=True),
    BufferSpec("req_id_per_token", ("max_tokens",), torch.int64, PadRule("free"), host=True),
    BufferSpec("req_pool_indices", ("max_bs",), torch.int64, PadRule("const", "dummy_req"), host=True),
    BufferSpec("cache_seqlens", ("max_bs",), torch.int32, PadRule("const", "pad_seq_len"), host=True),
    BufferSpec("cu_seqlens_q", ("max_bs+1",), torch.int32, PadRule("step", "pad_q_len"), host=True),
    BufferSpec("page_table", ("max_bs", "max_pages"), torch.int32, PadRule("const", "dummy_page")),
)
HOST_FIELDS = tuple(s.name for s in STEP_SPECS if s.host)


def write_host(
    batch: Batch, host: dict[str, np.ndarray], rows: int, tokens: int, pad: dict[str, int]
) -> None:
    """Write ``batch`` into host arrays holding ``rows`` requests and ``tokens`` token rows.

    Rows ``bs..rows`` are pad requests of ``pad["pad_q_len"]`` tokens each, with
    ``seq_len = pad_q_len`` (never shorter than their queries). Token rows past the pad
    requests (the ragged tail of a DRAFT_EXTEND graph) belong to no request: they lie past
    ``cu_seqlens_q[rows]``, write the dummy slot and are masked out of ``req_to_token``.
    Every element of ``[:rows]`` and ``[:tokens]`` is written, so nothing stale survives.
    """
    bs, n, pad_q = batch.bs, batch.num_tokens, pad["pad_q_len"]
    padded = n + (rows - bs) * pad_q
    assert padded <= tokens, f"{padded} token rows do not fit in {tokens}"
    host["input_ids"][:n] = batch.input_ids
    host["input_ids"][n:tokens] = 0
    host["positions"][:n] = batch.positions
    host["positions"][n:tokens] = 0
    host["out_cache_loc"][:n] = batch.out_cache_loc_steps[:, 0]
    host["out_cache_loc"][n:tokens] = pad["dummy_slot"]
    req_id = host["req_id_per_token"]
    req_id[:n] = np.repeat(np.arange(bs), batch.q_lens)
    req_id[n:padded] = np.repeat(np.arange(bs, rows), pad_q)
    req_id[padded:tokens] = max(rows - 1, 0)
    host["req_pool_indices"][:bs] = batch.req_pool_indices
    host["req_pool_indices"][bs:rows] = pad["dummy_req"]
    host["cache_seqlens"][:bs] = batch.seq_lens
    host["cache_seqlens"][bs:rows] = pad["pad_seq_len"]
    cu = host["cu_seqlens_q"]
    cu[0] = 0
    np.cumsum(batch.q_lens, out=cu[1 : bs + 1])
    cu[bs + 1 : rows + 1] = n + pad_q * np.arange(1, rows - bs + 1)


def record_slots(buffers: StepBuffers, req_to_token: ReqToToken) -> None:
    """Write this step's KV slots into ``req_to_token`` (device; inside the graph).

    Token ``t`` of row ``r`` has its KV at position ``cache_seqlens[r] - cu_seqlens_q[r + 1]
    + t`` of request ``req_pool_indices[r]``. Tokens past ``cu_seqlens_q[-1]`` (a ragged
    tail) are routed to the dummy request. In-place, no host sync.
    """
    rows, kv_pos = token_rows(buffers, req_to_token.dummy_req)
    req_to_token.table.index_put_((rows, kv_pos), buffers.out_cache_loc.to(torch.int32))


def gather_page_table(buffers: StepBuffers, req_to_token: ReqToToken, page_size: int) -> None:
    """``page_table[r, j] = req_to_token[req_pool_indices[r], j * page_size] // page_size``."""
    starts = req_to_token.table[buffers.req_pool_indices[:, None], req_to_token.page_starts[None, :]]
    torch.div(starts, page_size, rounding_mode="floor", out=buffers.page_table)


def derive(buffers: StepBuffers, req_to_token: ReqToToken, page_size: int) -> None:
    """Device half of the update: record this step's slots, then gather the page table."""
    record_slots(buffers, req_to_token)
    gather_page_table(buffers, req_to_token, page_size)
