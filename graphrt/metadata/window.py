"""The window group: what window-pool layers (:mod:`graphrt.kv.window`) read instead of the step's
``out_cache_loc`` and page table.

Host half: ``out_cache_loc [T, cols]`` int64, the window slot of every full slot the step
writes (column ``i``: draft step ``i`` of a DRAFT_DECODE chain; other modes use column 0), as
the runtime's :class:`~graphrt.kv.window.WindowPool` assigned them. Device half, inside the
graph (:func:`derive_window`, after the step's own derive)::

    mapping[full slot] = window slot                 for every slot the step writes
    page_table[r, j]   = mapping[step.page_table[r, j] * page_size] // page_size
                         for j >= lo[r] = max(first_pos[r] - window, 0) // page_size
                         the window dummy page below lo[r] (pages no query of the row sees)

``first_pos[r] = cache_seqlens[r] - q_len[r]`` is the row's first query position, so every
key a query sees lies in columns ``>= lo[r]``; columns past the row's keys hold the full dummy
page, whose mapping is the window dummy slot. Every element of the bucket is rewritten each
step (pad rows: dummy slots and pages). Token trees are refused with a window pool.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from graphrt.buffers import BufferSpec, Dims, PadRule, StaticBuffers
from graphrt.metadata.base import StepBuffers
from graphrt.metadata.groups import Geometry, GroupRow, WindowShape
from graphrt.step.batch import Batch


def window_specs(cols: int) -> tuple[BufferSpec, ...]:
    """``out_cache_loc [max_tokens, cols]`` (host) and ``page_table [max_bs, max_pages]`` (derived)."""
    return (
        BufferSpec(
            "out_cache_loc",
            ("max_tokens", cols),
            torch.int64,
            PadRule("const", "window_dummy_slot"),
            host=True,
        ),
        BufferSpec("page_table", ("max_bs", "max_pages"), torch.int32, PadRule("const", "window_dummy_page")),
    )


@dataclass(slots=True)
class WindowBuffers:
    """``out_cache_loc [T, cols]`` int64 window slots; ``page_table [bs, max_pages]`` int32
    window page ids (the window dummy page outside each row's window)."""

    out_cache_loc: torch.Tensor
    page_table: torch.Tensor


class WindowWriter:
    """Writes the window slots the pool assigned to the step; dummy slots everywhere else."""

    def __init__(self, shape: WindowShape) -> None:
        self.shape = shape

    def write(self, group: StaticBuffers, batch: Batch, rows: int, tokens: int, pad: dict[str, int]) -> bool:
        loc = group.next_mirror()["out_cache_loc"]
        loc[:tokens] = self.shape.dummy_slot
        n = batch.num_tokens
        if n:
            slots = self.shape.slots(batch)
            loc[:n, : slots.size // n] = slots.reshape(n, -1)
        return True

    def forget(self) -> None:
        return None


def derive_window(
    step: StepBuffers,
    full_loc: torch.Tensor,
    window: WindowBuffers,
    mapping: torch.Tensor,
    shape: WindowShape,
) -> None:
    """Record the step's window slots in ``mapping``, then gather the window page table.

    ``full_loc [T, k]``: the full slots written (``out_cache_loc[:, None]``, or a chain's
    ``draft_loc``), paired with ``window.out_cache_loc[:, :k]``. In place, sync-free.
    """
    k, ps = full_loc.shape[1], shape.page_size
    mapping.index_put_((full_loc.reshape(-1),), window.out_cache_loc[:, :k].reshape(-1).to(torch.int32))
    cu = step.cu_seqlens_q.long()
    first = step.cache_seqlens.long() - (cu[1:] - cu[:-1])
    lo = torch.div((first - shape.window).clamp_(min=0), ps, rounding_mode="floor")
    cols = torch.arange(step.page_table.shape[1], device=lo.device)
    pages = torch.div(mapping[step.page_table.long() * ps], ps, rounding_mode="floor")
    window.page_table.copy_(torch.where(cols[None, :] >= lo[:, None], pages, shape.dummy_page))


def window_cols(g: Geometry) -> int:
    """Columns of ``out_cache_loc``: a DRAFT_DECODE chain's steps, else 1."""
    return max(g.spec.draft_forwards, 1) if g.spec is not None else 1


def _writer(g: Geometry, dims: Dims, device: torch.device) -> WindowWriter:
    assert g.window is not None
    return WindowWriter(g.window)


#: Exists with a window pool; every mode writes it (its window layers store and read through it).
WINDOW_GROUP = GroupRow(
    "window",
    lambda g, dims: window_specs(window_cols(g)),
    lambda g: WindowBuffers,
    exists=lambda g: g.window is not None,
    used_by=lambda mode, g: True,
    writer=_writer,
)
