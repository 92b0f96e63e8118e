"""Chunked-local attention (Llama-4): its buffer group and its device-side update.

A local layer lets a query at KV position ``p`` see keys ``chunk_start(p) … p`` only, where
``chunk_start(p) = p - p % attention_chunk_size``. The scheme is a *virtual batch of one query
token per request*: every query token ``t`` (real, pad or ragged tail) becomes its own
request with ``q_len 1`` whose KV is the part of its chunk up to and including ``p_t``::

    local_cache_seqlens[t]  = p_t - chunk_start(p_t) + 1
    local_page_table[t, j]  = req_to_token[row_t, chunk_start(p_t) + j * page_size] // page_size
                              (dummy page where j * page_size >= local_cache_seqlens[t])
    local_cu_seqlens_q      = arange(num_tokens + 1)                (max_seqlen_q 1)

It is exact for any causal chain of query tokens (DECODE, TARGET_VERIFY with ``topk 1``,
DRAFT_EXTEND): token ``t`` alone decides what it sees, and sibling tokens of the same request
are earlier positions of the same sequence, already recorded in ``req_to_token`` by
:func:`graphrt.metadata.step.record_slots`. A DRAFT_DECODE chain re-derives the batch before each
draft step's forward (one buffer set, rewritten in graph order). For DECODE it is exactly Llama-4's virtual batch. Every
shape is a function of the graph key (``num_tokens`` rows, ``chunk_pages`` columns), so the
same update runs inside the captured graph and on the eager path; it rewrites every row of
the bucket, so a batch that shrinks leaves nothing stale. ``chunk_start`` is page-aligned
because ``attention_chunk_size % page_size == 0`` (checked), which keeps the table in page
units. Trees (``topk > 1``) are not chains and are refused by :class:`RuntimeConfig`.
(FA3 also has a native ``attention_chunk`` argument; the virtual batch is used so that the
reference backend and FA3 read the same metadata.)
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch

from graphrt.buffers import BufferSpec, PadRule
from graphrt.kv import ReqToToken
from graphrt.metadata.base import StepBuffers, token_rows
from graphrt.metadata.groups import GroupRow
from graphrt.step.config import check_chunk


def local_specs(chunk_pages: int) -> tuple[BufferSpec, ...]:
    """The local group: one virtual request per token row; ``chunk_pages`` table columns."""
    return (
        # NOTE: pad tokens hold 1..pad_q_len (their positions in the dummy request), so no
        # single constant; they read only the dummy page, which the page-table rule checks.
        BufferSpec("cache_seqlens", ("max_tokens",), torch.int32, PadRule("free")),
        BufferSpec("cu_seqlens_q", ("max_tokens+1",), torch.int32, PadRule("step", 1)),
        BufferSpec("page_table", ("max_tokens", chunk_pages), torch.int32, PadRule("const", "dummy_page")),
    )


@dataclass(slots=True)
class LocalBuffers:
    """``cache_seqlens [T]`` int32, ``cu_seqlens_q [T + 1]`` int32, ``page_table [T, chunk_pages]``
    int32 page ids; ``T`` the step's token rows. Field names match :class:`StepBuffers`, so a
    backend reads a virtual batch exactly as it reads a step."""

    cache_seqlens: torch.Tensor
    cu_seqlens_q: torch.Tensor
    page_table: torch.Tensor


@dataclass(frozen=True, slots=True)
class LocalGeometry:
    """Chunk and page size of the local group (from :class:`RuntimeConfig`)."""

    chunk_size: int
    page_size: int

    def __post_init__(self) -> None:
        check_chunk(self.chunk_size, self.page_size)

    def chunk_pages(self, max_pages: int) -> int:
        # NOTE: a chunk longer than the context never fills; the table needs no more columns
        # than a full-context request has pages.
        return min(self.chunk_size // self.page_size, max_pages)


def local_geometry(config: Any) -> LocalGeometry | None:
    """The local geometry of ``config`` (a :class:`RuntimeConfig`), or None without chunking."""
    if config.attention_chunk_size is None:
        return None
    return LocalGeometry(config.attention_chunk_size, config.page_size)


def derive_local(
    step: StepBuffers, local: LocalBuffers, req_to_token: ReqToToken, geometry: LocalGeometry, dummy_page: int
) -> None:
    """Write every row of ``local`` from this step's buffers (after ``record_slots``).

    In place and sync-free: it runs inside the captured graph on the graph path.
    """
    ps, chunk = geometry.page_size, geometry.chunk_size
    rows, kv_pos = token_rows(step, req_to_token.dummy_req)
    start = kv_pos - kv_pos % chunk
    local.cache_seqlens.copy_(kv_pos - start + 1)
    j = torch.arange(local.page_table.shape[1], device=kv_pos.device)
    cols = start[:, None] + j[None, :] * ps
    used = cols <= kv_pos[:, None]  # page j holds a key of this virtual request
    cols = cols.clamp_(max=req_to_token.max_context_len - 1)
    pages = torch.div(req_to_token.table[rows[:, None], cols], ps, rounding_mode="floor")
    local.page_table.copy_(torch.where(used, pages, dummy_page))
    torch.arange(local.cu_seqlens_q.shape[0], out=local.cu_seqlens_q)


def with_model_chunk(config: Any, chunk: int | None) -> Any:
    """``config`` (a :class:`RuntimeConfig`) with the model's chunk size filled in.

    Raises ``ValueError`` when both name a chunk size and they differ.
    """
    if chunk is None or config.attention_chunk_size == chunk:
        return config
    if config.attention_chunk_size is not None:
        raise ValueError(
            f"RuntimeConfig.attention_chunk_size {config.attention_chunk_size} != the model's "
            f"attention_chunk_size {chunk}"
        )
    return dataclasses.replace(config, attention_chunk_size=chunk)


#: Exists with chunked-local attention; every mode's program derives it on the device.
LOCAL_GROUP = GroupRow(
    "local",
    lambda g, dims: local_specs(g.local.chunk_pages(dims.max_pages)),
    lambda g: LocalBuffers,
    exists=lambda g: g.local is not None,
    used_by=lambda mode, g: True,
)
