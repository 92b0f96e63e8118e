"""The fused step update: one Triton kernel per step group update, inside the graph.

One program per (page-table row, column split). Program ``(r, 0)`` records row ``r``'s new KV
slots in ``req_to_token``; every program of row ``r`` then fills its share of page-table
columns ``[0, page_bound[r])``: the row's real pages below ``need[r] = ceil((cache_seqlens[r]
+ keys) / page_size)``, the dummy page from there on (erasing what an earlier, longer row
left). Work is O(real pages + pages to erase), never O(max_pages).

**What the kernel reads** (the contract the debug poison check follows): per row ``r < rows``
``cache_seqlens[r]``, ``req_pool_indices[r]``, ``cu_seqlens_q[r]``, ``cu_seqlens_q[r + 1]``,
``page_bound[r]``; the row's new slots ``out_cache_loc[cu_q[r]:cu_q[r + 1]]`` (DRAFT_DECODE
chains: ``draft_loc[cu_q[r], :]``); and ``req_to_token[req_pool_indices[r], j * page_size]``
only for ``j < need[r]`` — never a position past the row's real pages. A page whose first
position is one of this step's new tokens is taken from the new slots directly, so no
program reads a ``req_to_token`` entry another program writes in the same launch.
**What it writes**: ``req_to_token[req_pool_indices[r], new positions]`` and
``page_table[r, :page_bound[r]]``. Token rows past ``cu_seqlens_q[rows]`` (a ragged tail) are
not recorded: the torch update routes them to the dummy request, whose row already holds
the dummy slot everywhere, so both leave identical tables.
"""

from __future__ import annotations

import torch

from graphrt.kernels.switches import tl, triton, triton_enabled

#: Page-table columns per program iteration, and programs per row.
BLOCK = 256
SPLIT = 4
#: The switch of this kernel (:mod:`graphrt.kernels.switches`).
ENV = "GRAPHRT_FUSED_UPDATE"


def fused_update(device: torch.device) -> bool:
    """Whether the update of ``device`` runs the Triton kernel (CUDA, Triton importable)."""
    return triton_enabled(ENV, device)


if triton is not None:

    @triton.jit
    def _step_update(
        table,
        table_stride,
        cache_seqlens,
        cu_seqlens_q,
        req_pool_indices,
        loc,
        page_bound,
        page_table,
        pt_stride,
        pt_cols,
        dummy_page,
        keys,
        PS: tl.constexpr,
        STEPS: tl.constexpr,
        DRAFT: tl.constexpr,
        RECORD: tl.constexpr,
        BLOCK_COLS: tl.constexpr,
        SPLITS: tl.constexpr,
    ):
        r = tl.program_id(0)
        split = tl.program_id(1)
        seq = tl.load(cache_seqlens + r).to(tl.int64)
        row = tl.load(req_pool_indices + r).to(tl.int64)
        t0 = tl.load(cu_seqlens_q + r).to(tl.int64)
        t1 = tl.load(cu_seqlens_q + r + 1).to(tl.int64)
        if DRAFT:  # a chain: one token per row, its draft step i at position seq - 1 + i
            first = seq - 1
            count = STEPS + 0 * seq
            base = t0 * STEPS
        else:  # the row's tokens sit at its last q_len positions
            first = seq - (t1 - t0)
            count = t1 - t0
            base = t0
        row_ptr = table + row * table_stride
        if RECORD:  # noqa: SIM102 - a constexpr branch, then a runtime one
            if split == 0:
                for i in range(0, count, BLOCK_COLS):
                    offs = i + tl.arange(0, BLOCK_COLS)
                    ok = offs < count
                    slot = tl.load(loc + base + offs, mask=ok, other=0)
                    tl.store(row_ptr + first + offs, slot.to(tl.int32), mask=ok)
        need = (seq + keys + PS - 1) // PS
        bound = tl.minimum(tl.load(page_bound + r).to(tl.int64), pt_cols)
        for start in range(split * BLOCK_COLS, bound, SPLITS * BLOCK_COLS):
            j = start + tl.arange(0, BLOCK_COLS)
            inside = j < bound
            real = inside & (j < need)
            pos = j * PS
            if RECORD:  # noqa: SIM108 - constexpr branch (Triton)
                fresh = (pos >= first) & (pos < first + count)
            else:
                fresh = pos < 0
            old = tl.load(row_ptr + pos, mask=real & ~fresh, other=0).to(tl.int64)
            new = tl.load(loc + base + (pos - first), mask=real & fresh, other=0)
            page = tl.where(fresh, new, old) // PS
            page = tl.where(real, page, dummy_page)
            tl.store(page_table + r * pt_stride + j, page.to(tl.int32), mask=inside)


def step_update(
    table: torch.Tensor,
    cache_seqlens: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    req_pool_indices: torch.Tensor,
    loc: torch.Tensor,
    page_bound: torch.Tensor,
    page_table: torch.Tensor,
    *,
    page_size: int,
    dummy_page: int,
    keys: int = 0,
    record: bool = True,
) -> None:
    """Launch the fused update for ``page_table.shape[0]`` rows (see the module docstring).

    ``loc`` is ``out_cache_loc [T]`` int64, or a DRAFT_DECODE chain's ``draft_loc [T, steps]``
    (each row then records ``steps`` slots from position ``seq_len - 1``).
    """
    assert triton is not None, "the fused update needs Triton"
    rows = page_table.shape[0]
    draft = loc.dim() == 2
    steps = loc.shape[1] if draft else 1
    _step_update[(rows, SPLIT)](
        table,
        table.stride(0),
        cache_seqlens,
        cu_seqlens_q,
        req_pool_indices,
        loc,
        page_bound,
        page_table,
        page_table.stride(0),
        page_table.shape[1],
        dummy_page,
        keys,
        PS=page_size,
        STEPS=steps,
        DRAFT=draft,
        RECORD=record,
        BLOCK_COLS=BLOCK,
        SPLITS=SPLIT,
    )
