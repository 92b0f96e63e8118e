"""The step-metadata buffer group and the two halves of every update.

``write_host`` fills the host-written buffers (real rows, then pad rows per rule 3 of docs/architecture.md);
``derive`` runs on the device — inside the captured graph on the graph path — and records
the step's KV slots in ``req_to_token`` before gathering the page table from it. The eager
path calls the same two functions on fresh, exact-size arrays.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import numpy as np
import torch

from graphrt.buffers import BufferSpec, Dims, PadRule, StaticBuffers
from graphrt.kv import ReqToToken
from graphrt.metadata.base import StepBuffers, token_rows
from graphrt.metadata.groups import GroupRow
from graphrt.metadata.kernels import fused_update, step_update
from graphrt.step.batch import Batch
from graphrt.step.hostops import arange
from graphrt.step.modes import MODES, ForwardMode, SpecGeometry

STEP_SPECS = (
    BufferSpec("input_ids", ("max_tokens",), torch.int64, PadRule("const", 0), host=True),
    BufferSpec("positions", ("max_tokens",), torch.int64, PadRule("const", 0), host=True),
    BufferSpec("out_cache_loc", ("max_tokens",), torch.int64, PadRule("const", "dummy_slot"), host=True),
    BufferSpec("req_id_per_token", ("max_tokens",), torch.int64, PadRule("free"), host=True),
    BufferSpec("req_pool_indices", ("max_bs",), torch.int64, PadRule("const", "dummy_req"), host=True),
    BufferSpec("cache_seqlens", ("max_bs",), torch.int32, PadRule("const", "pad_seq_len"), host=True),
    BufferSpec("cu_seqlens_q", ("max_bs+1",), torch.int32, PadRule("step", "pad_q_len"), host=True),
    # NOTE: the fused update rewrites page-table columns [0, page_bound) of each row: its real
    # pages, then the dummy page over what an earlier step left there (see PageBounds).
    BufferSpec("page_bound", ("max_bs",), torch.int32, PadRule("free"), host=True),
    BufferSpec("page_table", ("max_bs", "max_pages"), torch.int32, PadRule("const", "dummy_page")),
)
HOST_FIELDS = tuple(s.name for s in STEP_SPECS if s.host)


class MirrorTag(NamedTuple):
    """What one host mirror's pad and constant regions hold after a :func:`write_host`.

    ``key`` is the layout (rows, token rows, pad values, uniform or ragged); ``bs`` / ``n`` the
    real rows and tokens written last. The next write with the same key rewrites only the
    rows the last batch had and this one has not. A named tuple: one is built every step.
    """

    key: tuple
    bs: int
    n: int


class PageBounds:
    """Host record of the page-table columns each row may hold non-dummy pages in.

    ``held[r]``: columns ``>= held[r]`` of row ``r`` hold the dummy page (``max_pages``
    when unknown: at start, after poison or capture). Each update writes ``page_bound[r] =
    max(held[r], need[r])`` so the fused kernel rewrites the old real pages with the dummy
    page, and records ``held[r] = need[r]``. With ``track`` off (the torch update rewrites
    every column) ``page_bound`` is simply ``max_pages``.
    """

    def __init__(self, max_bs: int, max_pages: int, page_size: int, track: bool) -> None:
        self.max_pages, self.page_size, self.track = max_pages, page_size, track
        self.held = np.full(max_bs, max_pages, dtype=np.int64)
        self.need = np.zeros(max_bs, dtype=np.int64)
        # NOTE: 0-d arrays, not ints: numpy 2 converts a Python scalar operand on every call
        # (docs/performance.md); ``_bias`` per ``keys`` (a function of the mode).
        self._ps = np.array(page_size, dtype=np.int64)
        self._bias: dict[int, np.ndarray] = {}

    def forget(self) -> None:
        """The device page table is unknown (poisoned, or written by a capture)."""
        self.held.fill(self.max_pages)

    def write(self, bound: np.ndarray, seq: np.ndarray, rows: int, keys: int, pad_seq_len: int) -> None:
        """``bound[:rows]`` for real rows with KV lengths ``seq`` (+ ``keys`` draft keys) and pads."""
        if not self.track:
            bound[:rows] = self.max_pages
            return
        bias = self._bias.get(keys)
        if bias is None:
            bias = self._bias[keys] = np.array(keys + self.page_size - 1, dtype=np.int64)
        bs, need, held = seq.size, self.need[:rows], self.held[:rows]
        np.floor_divide(seq + bias, self._ps, out=need[:bs])
        if rows > bs:
            need[bs:] = -(-(pad_seq_len + keys) // self.page_size)
        np.maximum(held, need, out=bound[:rows], casting="unsafe")
        held[:] = need


def draft_keys(mode: ForwardMode, spec: SpecGeometry | None) -> int:
    """Keys past ``cache_seqlens`` a step's page table must cover: a draft chain's later
    steps (DRAFT_DECODE without a tree); 0 for every other step."""
    if MODES[mode].draft_steps and spec is not None and spec.topk == 1:
        return max(spec.draft_forwards - 1, 0)
    return 0


class StepWriter:
    """The step group's host half: :func:`write_host` into the next mirror, page bounds.

    Owns what it knows of the buffers: each mirror's :class:`MirrorTag` and the page-table
    columns each row may hold real pages in (:class:`PageBounds`); :meth:`forget` drops both
    (poison, capture), so the next write rewrites every element and column.
    """

    def __init__(self, dims: Dims, page_size: int, spec: SpecGeometry | None, device: torch.device) -> None:
        self.spec = spec
        self.pages = PageBounds(dims.max_bs, dims.max_pages, page_size, fused_update(device))
        self.tags: dict[int, MirrorTag | None] = {}
        self.pages_known = False

    def write(self, group: StaticBuffers, batch: Batch, rows: int, tokens: int, pad: dict[str, int]) -> bool:
        host = group.next_mirror()
        self.tags[group.slot] = write_host(batch, host, rows, tokens, pad, self.tags.get(group.slot))
        if not self.pages_known:
            # NOTE: a fresh, poisoned or just-captured page table: rewrite every column once.
            self.pages.forget()
            self.pages_known = True
        keys = draft_keys(batch.mode, self.spec)
        self.pages.write(host["page_bound"], batch.seq_lens, rows, keys, pad["pad_seq_len"])
        return True

    def forget(self) -> None:
        self.tags.clear()
        self.pages_known = False


#: Every step writes it; every mode reads it.
STEP_GROUP = GroupRow(
    "step",
    lambda g, dims: STEP_SPECS,
    lambda g: StepBuffers,
    exists=lambda g: True,
    used_by=lambda mode, g: True,
    writer=lambda g, dims, device: StepWriter(dims, g.page_size, g.spec, device),
)


def _positions(batch: Batch, out: np.ndarray, bs: int, n: int) -> None:
    """``out[:n] = batch.positions``, without temporaries for uniform chains."""
    if not bs:
        return
    if n == bs and batch.tree_mask is None:  # NOTE: one token per request, any mode
        np.subtract(batch.seq_lens, _ONE, out=out[:n])
        return
    spec = MODES[batch.mode]
    if spec.ragged or batch.tree_mask is not None:
        out[:n] = batch.positions
    elif spec.draft_steps:  # every branch at seq_len - 1
        np.subtract(batch.seq_lens[:, None], _ONE, out=out[:n].reshape(bs, n // bs))
    else:
        q = n // bs
        np.add((batch.seq_lens - q)[:, None], arange(q), out=out[:n].reshape(bs, q))


#: 0-d, not an int: numpy 2 converts a Python scalar operand on every call.
_ONE = np.array(1, dtype=np.int64)


def write_host(
    batch: Batch,
    host: dict[str, np.ndarray],
    rows: int,
    tokens: int,
    pad: dict[str, int],
    tag: MirrorTag | None = None,
) -> MirrorTag:
    """Write ``batch`` into host arrays holding ``rows`` requests and ``tokens`` token rows.

    Rows ``bs..rows`` are pad requests of ``pad["pad_q_len"]`` tokens each, with
    ``seq_len = pad_q_len`` (never shorter than their queries). Token rows past the pad
    requests (the ragged tail of a DRAFT_EXTEND graph) belong to no request: they lie past
    ``cu_seqlens_q[rows]``, write the dummy slot and are masked out of ``req_to_token``.
    After the call every element of ``[:rows]`` and ``[:tokens]`` holds this step's value;
    ``tag`` (what this mirror held, from the previous call) lets it skip pad and constant
    elements that already do. ``page_bound`` is left to :class:`PageBounds`. The batch must
    have passed :meth:`Batch.check` (uniform modes: every ``q_len`` equals ``pad_q_len``).
    """
    bs, n, pad_q = batch.bs, batch.num_tokens, pad["pad_q_len"]
    padded = n + (rows - bs) * pad_q
    assert padded <= tokens, f"{padded} token rows do not fit in {tokens}"
    uniform = not MODES[batch.mode].ragged
    key = (rows, tokens, pad_q, pad["pad_seq_len"], pad["dummy_slot"], pad["dummy_req"], uniform)
    same = tag is not None and tag.key == key
    row_end = max(bs, tag.bs) if same else rows  # rows [bs, row_end) need their pad values
    tok_end = max(n, tag.n) if same else tokens
    loc = batch.out_cache_loc
    host["input_ids"][:n] = batch.input_ids
    _positions(batch, host["positions"], bs, n)
    host["out_cache_loc"][:n] = loc if loc.size == n else batch.out_cache_loc_steps[:, 0]
    host["req_pool_indices"][:bs] = batch.req_pool_indices
    host["cache_seqlens"][:bs] = batch.seq_lens
    # NOTE: in the steady state (same key, batch not shrinking) no pad element changes: the
    # guards skip five empty slice assignments.
    if tok_end > n:
        host["input_ids"][n:tok_end] = 0
        host["positions"][n:tok_end] = 0
        host["out_cache_loc"][n:tok_end] = pad["dummy_slot"]
    if row_end > bs:
        host["req_pool_indices"][bs:row_end] = pad["dummy_req"]
        host["cache_seqlens"][bs:row_end] = pad["pad_seq_len"]
    cu, req_id = host["cu_seqlens_q"], host["req_id_per_token"]
    if uniform and padded == tokens:
        # NOTE: every row (real or pad) has pad_q tokens: both tables are functions of the key.
        if not same:
            np.multiply(arange(rows + 1), pad_q, out=cu[: rows + 1])
            req_id[:tokens] = np.repeat(arange(rows), pad_q)[:tokens]
        return MirrorTag(key, bs, n)
    req_id[:n] = np.repeat(arange(bs), batch.q_lens)
    req_id[n:padded] = np.repeat(np.arange(bs, rows), pad_q)
    req_id[padded:tokens] = max(rows - 1, 0)
    cu[0] = 0
    np.cumsum(batch.q_lens, out=cu[1 : bs + 1])
    cu[bs + 1 : rows + 1] = n + pad_q * arange(rows - bs + 1)[1:]
    return MirrorTag(key, bs, n)


def record_slots(buffers: StepBuffers, req_to_token: ReqToToken) -> None:
    """Write this step's KV slots into ``req_to_token`` (device; inside the graph).

    Token ``t`` of row ``r`` has its KV at position ``cache_seqlens[r] - cu_seqlens_q[r + 1]
    + t`` of request ``req_pool_indices[r]``. Tokens past ``cu_seqlens_q[-1]`` (a ragged
    tail) are routed to the dummy request. In-place, no host sync.
    """
    rows, kv_pos = token_rows(buffers, req_to_token.dummy_req)
    req_to_token.table.index_put_((rows, kv_pos), buffers.out_cache_loc.to(torch.int32))


def gather_page_table(buffers: StepBuffers, req_to_token: ReqToToken, page_size: int, keys: int = 0) -> None:
    """``page_table[r, j] = req_to_token[req_pool_indices[r], j * page_size] // page_size`` for
    the row's real pages ``j < ceil((cache_seqlens[r] + keys) / page_size)``, the dummy page
    past them (the torch update: reads every column; the oracle of the fused kernel)."""
    table = req_to_token.table
    starts = table[buffers.req_pool_indices[:, None], req_to_token.page_starts[None, :]]
    need = torch.div(buffers.cache_seqlens.long() + (keys + page_size - 1), page_size, rounding_mode="floor")
    cols = torch.arange(starts.shape[1], device=starts.device)
    pages = torch.div(starts, page_size, rounding_mode="floor")
    dummy = req_to_token.dummy_slot // page_size
    buffers.page_table.copy_(torch.where(cols[None, :] < need[:, None], pages, dummy))


def derive(buffers: StepBuffers, req_to_token: ReqToToken, page_size: int) -> None:
    """Device half of the update: record this step's slots, then gather the page table.

    On CUDA one fused Triton kernel (:mod:`graphrt.metadata.kernels`) does both in O(real
    pages); elsewhere the torch ops below, which are its oracle.
    """
    if fused_update(buffers.page_table.device):
        _fused(buffers, req_to_token, page_size, buffers.out_cache_loc, 0, record=True)
        return
    record_slots(buffers, req_to_token)
    gather_page_table(buffers, req_to_token, page_size)


def derive_draft(
    buffers: StepBuffers, draft_loc: torch.Tensor, req_to_token: ReqToToken, page_size: int, tree: bool
) -> None:
    """DRAFT_DECODE: a chain records every draft step's slot (``draft_loc [T, steps]``, step
    ``i`` at position ``seq_len - 1 + i``) and its page table covers the last step's keys;
    a tree records nothing (its drafts are read through the cascade) and gathers the prefix."""
    keys = 0 if tree else draft_loc.shape[1] - 1
    if fused_update(buffers.page_table.device):
        _fused(buffers, req_to_token, page_size, draft_loc, keys, record=not tree)
        return
    if not tree:
        for i in range(draft_loc.shape[1]):
            step = dataclasses.replace(
                buffers,
                out_cache_loc=draft_loc[:, i],
                positions=buffers.positions + i,
                cache_seqlens=buffers.cache_seqlens + i,
            )
            record_slots(step, req_to_token)
    gather_page_table(buffers, req_to_token, page_size, keys)


def _fused(
    b: StepBuffers, req_to_token: ReqToToken, page_size: int, loc: torch.Tensor, keys: int, record: bool
) -> None:
    step_update(
        req_to_token.table,
        b.cache_seqlens,
        b.cu_seqlens_q,
        b.req_pool_indices,
        loc,
        b.page_bound,
        b.page_table,
        page_size=page_size,
        dummy_page=req_to_token.dummy_slot // page_size,
        keys=keys,
        record=record,
    )
