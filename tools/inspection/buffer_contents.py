"""One buffer's rows as a snapshot's last step wrote them, each pad row checked against its rule
(shared by ``graphrt inspect`` and the TUI through :mod:`graphrt.tools.inspection.report`)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from graphrt.debug.snapshot import Snapshot


@dataclass(frozen=True, slots=True)
class BufferRows:
    """One buffer's rows for a bucket. ``status`` per row: real, pad, pad! (breaks the rule), stale."""

    name: str
    bucket: int
    values: tuple[str, ...]
    status: tuple[str, ...]

    @property
    def broken(self) -> list[int]:
        """Rows that break the buffer's pad rule."""
        return [i for i, s in enumerate(self.status) if s == "pad!"]


def _rows_for(dim: str | int, bs: int, tpr: int) -> int | None:
    if not isinstance(dim, str) or dim.partition("+")[0] not in ("max_bs", "max_tokens"):
        return None
    name, _, extra = dim.partition("+")
    return (bs if name == "max_bs" else bs * tpr) + int(extra or 0)


def _fmt(row: np.ndarray, limit: int = 12, read: int | None = None) -> str:
    """Up to ``limit`` values; with ``read``, entries past it are counted as unread, not shown."""
    flat = np.atleast_1d(row).ravel()
    if read is not None and read < flat.size:
        shown = " ".join(str(v) for v in flat[: min(read, limit)])
        more = f" … (+{read - limit})" if read > limit else ""
        return f"{shown}{more} ┊ {flat.size - read} unread"
    text = " ".join(str(v) for v in flat[:limit])
    return text + (f" … (+{flat.size - limit})" if flat.size > limit else "")


def _pages_read(snap: Snapshot, name: str, rows: int) -> list[int | None]:
    """Per row of a page table, the entries its kernels read: ``ceil(cache_seqlens / page_size)``."""
    page_size = snap.config.get("page_size")
    lens = snap.arrays.get("cache_seqlens")
    if name != "page_table" or not page_size or lens is None or lens.ndim != 1:
        return [None] * rows
    return [int(-(-int(lens[i]) // page_size)) if i < len(lens) else None for i in range(rows)]


def buffer_contents(snap: Snapshot, name: str, bucket: int) -> BufferRows | None:
    """Rows ``[:bucket]`` of ``name`` as written by the snapshot's last step, pad rows checked."""
    spec = next((b for b in snap.memory.buffers if b.name == name), None)
    if spec is None or name not in snap.arrays:
        return None
    c = snap.contents
    written = c.bucket if c.bucket is not None else 0
    n = _rows_for(spec.shape[0], bucket, c.tokens_per_req)
    real = _rows_for(spec.shape[0], c.bs, c.tokens_per_req)
    end = _rows_for(spec.shape[0], written, c.tokens_per_req)
    arr = snap.arrays[name]
    if n is None or real is None or end is None:  # NOTE: no batch axis: every row is real
        return BufferRows(name, bucket, tuple(_fmt(r) for r in arr), ("real",) * len(arr))
    arr = arr[: min(n, len(arr))]
    read = _pages_read(snap, name, len(arr))
    value = c.pad_values.get(spec.pad_value, 0) if isinstance(spec.pad_value, str) else spec.pad_value
    status = []
    for i, row in enumerate(arr):
        if i < real:
            status.append("real")
        elif i >= end:
            status.append("stale")
        elif spec.pad_kind == "const":
            status.append("pad" if np.all(row == value) else "pad!")
        elif spec.pad_kind == "step":
            status.append("pad" if i == 0 or row - arr[i - 1] == value else "pad!")
        else:
            status.append("pad")
    values = tuple(_fmt(r, read=read[i] if status[i] != "stale" else None) for i, r in enumerate(arr))
    return BufferRows(name, bucket, values, tuple(status))
