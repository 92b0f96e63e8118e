"""The window-layer KV pool: sliding-window layers keep only the positions their window sees.

Window layers (a query at ``p`` sees keys ``p - window … p``) store their K and V in a pool of
their own pages (:class:`WindowLayers`, sized by :func:`window_pool_pages`), not in the full
cache's pages. Each row holds window pages for its *logical* pages ``[lo, hi)`` only: what its
next steps may read. Full slots stay the step's currency (``out_cache_loc``, ``req_to_token``,
the ledger); :class:`WindowPool` gives each written full slot a window slot on the host (same
offset in the page, one window page per logical page of a row), and the step records
``mapping[full slot] = window slot`` inside the graph (SGLang's ``full_to_swa_index_mapping``),
from which window layers gather their own page table (:mod:`graphrt.metadata.window`).

Recycling: after a step writing positions ``s … e-1`` of a row, pages wholly below
``e - step - window`` are released (``step``: the most positions one step writes, hence how
far a later step may rewind: a verify's rejected drafts). A step that would read a released
page is refused with :class:`~graphrt.kv.ledger.KVIsolationError`; a row rewritten from
position 0 starts afresh. A window page has one owner (a row) at a time.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from graphrt.kv.ledger import KVIsolationError, KVWrites


@dataclass(frozen=True, slots=True)
class WindowLayers:
    """Which layers use the window pool and how large it is.

    ``window``: the largest window of those layers; ``layers``: their ids; ``num_pages``: window
    pages including the reserved dummy page (the last); ``step``: the most positions one step
    writes per request (graphed modes), which is also how far a later step may rewind.
    """

    window: int
    layers: frozenset[int]
    num_pages: int
    step: int

    def __post_init__(self) -> None:
        if self.window < 1 or self.step < 1:
            raise ValueError(f"window and step must be >= 1, got {self.window}, {self.step}")
        if self.num_pages < 2:
            raise ValueError(f"a window pool needs >= 2 pages (one is the dummy), got {self.num_pages}")


def pages_per_request(window: int, step: int, page_size: int) -> int:
    """Window pages one request holds at most: ``window + step`` positions, one page for the
    window's start inside a page."""
    return -(-(window + step) // page_size) + 1


def window_pool_pages(window: int, step: int, page_size: int, max_reqs: int, prefill_tokens: int) -> int:
    """Pages of a window pool (dummy included) for ``max_reqs`` requests, plus room for
    ``prefill_tokens`` positions a prefill (EXTEND) writes past its requests' share at once."""
    return max_reqs * pages_per_request(window, step, page_size) + -(-prefill_tokens // page_size) + 1


class WindowPool:
    """Window pages of each request row (host), and the full → window slot ``mapping`` (device).

    ``mapping [full_slots]`` int32: the window slot of every full slot a step has written (the
    dummy slot's entry is the window dummy slot); entries of released pages go stale and are
    never read (the window page table masks what lies below a row's window).
    """

    def __init__(
        self,
        layers: WindowLayers,
        full_slots: int,
        max_reqs: int,
        max_pages: int,
        page_size: int,
        device: torch.device,
    ) -> None:
        self.layers, self.page_size, self.window, self.step = layers, page_size, layers.window, layers.step
        self.dummy_page = layers.num_pages - 1
        self.dummy_slot = self.dummy_page * page_size
        self.mapping = torch.full((full_slots,), self.dummy_slot, dtype=torch.int32, device=device)
        self.table = np.full((max_reqs, max_pages), -1, dtype=np.int64)  # window page per logical page
        self.lo = np.zeros(max_reqs, dtype=np.int64)  # held logical pages: [lo, hi)
        self.hi = np.zeros(max_reqs, dtype=np.int64)
        self.owner = np.full(self.dummy_page, -1, dtype=np.int64)  # row holding each window page
        self.free_pages = np.arange(self.dummy_page - 1, -1, -1, dtype=np.int64)  # a stack
        self.top = self.dummy_page
        self._batch: Any = None
        self._slots = np.zeros(0, dtype=np.int64)

    @property
    def num_free(self) -> int:
        return self.top

    def held(self, row: int) -> int:
        """Window pages row ``row`` holds now."""
        return int(np.count_nonzero(self.table[row] >= 0))

    # ---- a step --------------------------------------------------------------------------
    def assign(self, batch: Any, w: KVWrites) -> np.ndarray:
        """Window slots of ``batch``'s writes ``w`` (aligned with ``w.slots``), pages allocated.

        Checks first (nothing changes when it raises): the keys the step reads below its first
        written position are still held, and the pool has the pages it needs.
        """
        ps = self.page_size
        s, e = w.starts, w.starts + w.counts
        read_lo = np.maximum(s - self.window, 0)
        lo, hi = self.lo[w.rows], self.hi[w.rows]
        reads = read_lo < s
        bad = reads & ((read_lo // ps < lo) | (-(-s // ps) > hi))
        if bad.any():
            i = int(np.argmax(bad))
            raise KVIsolationError(
                f"request {i} (row {int(w.rows[i])}) reads window keys from position {int(read_lo[i])}, "
                f"but the window pool released its pages below position {int(lo[i]) * ps} "
                f"(a step may rewind at most {self.step} position(s) from a row's end)"
            )
        fresh = ~reads | (hi <= lo)  # NOTE: rewritten from position 0: nothing kept
        keep = np.minimum(np.maximum(e - self.step - self.window, 0), read_lo) // ps
        new_lo = np.where(fresh, 0, np.maximum(keep, lo))
        new_hi = -(-e // ps)
        # NOTE: held pages stay [lo, hi): release below the new start and past the new end,
        # allocate what the writes reach past ``hi`` (a fresh row: release all, allocate all).
        rel_hi = np.where(fresh, hi, np.minimum(new_lo, hi))
        top_lo = np.maximum(new_hi, rel_hi)
        alloc_lo = np.where(fresh, 0, np.maximum(hi, new_lo))
        released = int(np.maximum(rel_hi - lo, 0).sum() + np.maximum(hi - top_lo, 0).sum())
        need = int(np.maximum(new_hi - alloc_lo, 0).sum())
        if need > self.top + released:
            raise KVIsolationError(
                f"the window KV pool has {self.top} free page(s) (+{released} this step releases), "
                f"this step needs {need}: run fewer prefill tokens at once (pool of {self.dummy_page} pages)"
            )
        self._release(w.rows, lo, rel_hi)
        self._release(w.rows, top_lo, hi)
        self._allocate(w.rows, alloc_lo, new_hi)
        self.lo[w.rows], self.hi[w.rows] = new_lo, new_hi
        rows = w.rows if w.per_row else w.rows[w.slot_req]
        pos = w.slot_pos
        self._batch, self._slots = batch, self.table[rows, pos // ps] * ps + pos % ps
        return self._slots

    def commit(self, w: KVWrites) -> None:
        """After the step ran: release pages no later step may read (a prefill's early pages)."""
        keep = np.maximum(w.starts + w.counts - self.step - self.window, 0) // self.page_size
        lo = self.lo[w.rows]
        more = keep > lo
        if more.any():
            rows, lo, keep = w.rows[more], lo[more], keep[more]
            self._release(rows, lo, np.minimum(keep, self.hi[rows]))
            self.lo[rows] = keep

    def slots(self, batch: Any) -> np.ndarray:
        """The window slots :meth:`assign` gave ``batch`` (none for a batch without writes)."""
        if batch is self._batch:
            return self._slots
        if batch.out_cache_loc.size == 0:
            return batch.out_cache_loc
        raise RuntimeError("window slots were not assigned to this batch (GraphRuntime.run assigns them)")

    def free(self, row: int) -> None:
        """Release every window page of ``row``."""
        rows = np.array([row])
        self._release(rows, self.lo[rows], self.hi[rows])
        self.lo[row] = self.hi[row] = 0

    # ---- pages ---------------------------------------------------------------------------
    def _release(self, rows: np.ndarray, a: np.ndarray, b: np.ndarray) -> None:
        r, j = _spans(rows, a, b)
        pages = self.table[r, j]
        pages = pages[pages >= 0]
        self.table[r, j] = -1
        self.owner[pages] = -1
        self.free_pages[self.top : self.top + pages.size] = pages
        self.top += pages.size

    def _allocate(self, rows: np.ndarray, a: np.ndarray, b: np.ndarray) -> None:
        r, j = _spans(rows, a, b)
        if not r.size:
            return
        pages = self.free_pages[self.top - r.size : self.top][::-1].copy()
        self.top -= r.size
        self.table[r, j] = pages
        self.owner[pages] = r


def _spans(rows: np.ndarray, a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Every ``(rows[i], j)`` for ``a[i] <= j < b[i]`` (empty spans skipped)."""
    n = np.maximum(b - a, 0)
    total = int(n.sum())
    if not total:
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty
    r = np.repeat(rows, n)
    first = np.repeat(a - np.cumsum(n) + n, n)
    return r, first + np.arange(total)


def window_step(config: Any) -> int:
    """Positions one graphed step of ``config`` writes per request at most (a draft chain: its
    steps; a MIXED step: its largest token bucket, all of it one request's chunk)."""
    spec = config.speculative
    draft = spec.draft_forwards if spec is not None else 1
    return max(config.max_rows_per_req, draft, *getattr(config, "token_buckets", ()), 1)
