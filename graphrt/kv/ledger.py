"""Which KV each request row validly holds: host arrays behind the isolation checks.

The page is the unit of ownership. A row's *valid length* counts the positions it has written
since it was (re)assigned. Logical page ``j`` of a row (positions ``j*ps .. j*ps+ps-1``) lives
in exactly one physical page: the page its position ``j*ps`` was written to, which is the page
the attention's page table reads for every position of ``j``. A physical page is held by one
live row, or shared read-only as a whole page (:meth:`KVLedger.share_prefix`); ``refs`` counts
the rows holding each page.

A step that writes positions ``p … p+q-1`` of a row needs the row valid up to ``p`` and leaves
it valid up to ``p+q``: what the row held from ``p`` on is dropped, and pages left holding none
of its positions are released. Each position goes to the one physical page of its logical
page: the page the row keeps (held by it alone: a shared page is read-only), or for a page the
step opens (writes from its first position) one page for all of its positions, which no live
row holds (save the writing row at a logical page it drops now). Anything else raises
:class:`KVIsolationError` before anything is written (messages: :mod:`graphrt.kv.ownership`).
Checks and commits are vectorised over the step's tokens: no per-request Python loop.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from graphrt.kv.ownership import KVIsolationError, check_pages, check_scratch
from graphrt.step.batch import Batch
from graphrt.step.hostops import any_true, arange, umax, umin
from graphrt.step.modes import MODES


class KVWrites(NamedTuple):
    """What one step reads and writes (host int64 arrays).

    ``rows``, ``starts``, ``counts``: ``[bs]`` — request row, first position written (the step
    reads the row's positions ``< start``), positions written into the row. ``slots``,
    ``slot_req``, ``slot_pos``: ``[n]`` — every KV slot written, its request index, and its
    position. ``recorded=False``: scratch slots (tree drafts) that enter no row. ``per_row``:
    slot ``i`` belongs to request ``i`` (one write per request), so the hot path skips the
    ``rows[slot_req]`` gathers. A named tuple, not a frozen dataclass: built every step, and
    a frozen dataclass's ``__init__`` costs ~1 µs of ``object.__setattr__`` calls.
    """

    rows: np.ndarray
    starts: np.ndarray
    counts: np.ndarray
    slots: np.ndarray
    slot_req: np.ndarray
    slot_pos: np.ndarray
    recorded: bool = True
    per_row: bool = False

    @classmethod
    def of(cls, batch: Batch, scratch: bool = False) -> KVWrites:
        """The writes of ``batch``; ``scratch``: a tree DRAFT_DECODE (drafts in scratch slots)."""
        draft = MODES[batch.mode].draft_steps
        starts = batch.seq_lens - 1 if draft else batch.seq_lens - batch.q_lens
        if batch.out_cache_loc.size == batch.bs and not scratch:
            # NOTE: one token per request (DECODE, a 1-step chain): no repeats needed.
            req = arange(starts.size)
            loc = batch.out_cache_loc
            return cls(batch.req_pool_indices, starts, batch.q_lens, loc, req, starts, True, True)
        per_req = batch.q_lens * batch.draft_steps
        slot_req = np.repeat(np.arange(batch.bs), per_req)
        counts = np.zeros_like(starts) if scratch else per_req
        return cls(
            batch.req_pool_indices,
            starts,
            counts,
            batch.out_cache_loc,
            slot_req,
            batch.kv_positions,
            not scratch,
        )


class KVLedger:
    """Host state of ``max_reqs`` request rows over the pages of ``num_slots`` live KV slots.

    ``valid_lens [max_reqs]``, ``table [max_reqs, max_context_len]`` (int32 host mirror of the
    valid entries of ``req_to_token``), ``refs [num_pages]`` (rows holding each page; 0: free).

    Derived, for the decode fast path (a step appending one token per row passes when
    ``key[slot] == cursor[row]`` for every token): ``cursor [max_reqs]``, what the row's next
    position must take — the next slot of the page its last position is in, ``open`` (past
    every slot) when that position opens a page, or -2 when its page is shared (read-only);
    ``key [slots]``: a slot inside a page is its own key, a page's first slot is ``open``
    while the page is free and -1 while a row holds it.
    """

    def __init__(self, max_reqs: int, max_context_len: int, num_slots: int, page_size: int = 1) -> None:
        if page_size < 1:
            raise ValueError(f"page_size must be >= 1, got {page_size}")
        self.page_size = page_size
        self.ps = np.array(page_size, dtype=np.int64)  # NOTE: 0-d: ufuncs skip converting an int
        num_pages = -(-num_slots // page_size)
        end = num_pages * page_size
        self.valid_lens = np.zeros(max_reqs, dtype=np.int64)
        self.table = np.zeros((max_reqs, max_context_len), dtype=np.int32)
        self.refs = np.zeros(num_pages, dtype=np.int64)
        self.open = np.array(end, dtype=np.int64)
        self.cursor = np.full(max_reqs, end, dtype=np.int64)
        self.key = np.arange(end, dtype=np.int64)
        self.key[::page_size] = end
        # NOTE: the cursor after writing each slot, looked up (8 bytes a slot) rather than worked
        # out each step: slot + 1, or ``open`` after the last slot of a page.
        self._after = np.arange(1, end + 1, dtype=np.int64)
        self._after[page_size - 1 :: page_size] = end

    # ---- checks (raise before anything is written) ---------------------------------------
    def check(self, w: KVWrites) -> None:
        """Raise :class:`KVIsolationError` naming the request, the position and the pages.

        Recorded writes of one request must be its positions ``start, start + 1, …`` in order
        (what :meth:`KVWrites.of` gives), and each slot aligned with its position
        (``slot % ps == position % ps``: :meth:`Batch.check` runs first).
        """
        valid = self.valid_lens[w.rows]
        if w.per_row and valid.tobytes() == w.starts.tobytes() and self._fits_cursor(w):
            return
        short = valid < w.starts
        if any_true(short):
            i = int(np.argmax(short))
            row, start, have = int(w.rows[i]), int(w.starts[i]), int(valid[i])
            raise KVIsolationError(
                f"request {i} (row {row}) reads KV positions 0..{start - 1}, but row {row} has written "
                f"only {have} position(s) since it was assigned: position {have} holds no KV of "
                f"this request (limit {have})"
            )
        if not w.slots.size:
            return
        if not w.recorded:
            check_scratch(self, w, valid)
        elif not self._same_tail(w, valid):
            check_pages(self, w, valid)

    def _fits_cursor(self, w: KVWrites) -> bool:
        """True when a one-token-per-row step that appends (starts at each row's valid length)
        puts every token where the row's cursor says, or opens a free page where it says so.

        NOTE: the decode steady state: two gathers and a compare.
        """
        if self.page_size == 1:  # NOTE: every position opens its page: the page must be free
            return not any_true(self.refs[w.slots])
        return self.key[w.slots].tobytes() == self.cursor[w.rows].tobytes()

    def _same_tail(self, w: KVWrites, valid: np.ndarray) -> bool:
        """True when the step rewrites exactly the positions it drops, each with the slot it
        holds, in pages no other row shares (a verify after a verify, a retried step)."""
        if valid.tobytes() != (w.starts + w.counts).tobytes():
            return False
        rows = w.rows if w.per_row else w.rows[w.slot_req]
        if any_true(self.table[rows, w.slot_pos] != w.slots):
            return False
        return not any_true(self.refs[w.slots // self.ps] != 1)

    def holders(self, page: int) -> np.ndarray:
        """The live rows holding physical ``page`` (int64, ascending; empty when it is free).

        NOTE: a search over every row's page table: for messages and tests, not the step path.
        """
        if not self.refs[page]:
            return np.zeros(0, dtype=np.int64)
        return np.flatnonzero(self._holds(page).any(axis=1))

    def logical_page(self, row: int, page: int) -> int:
        """The logical page of ``row`` that physical ``page`` is (-1: the row does not hold it)."""
        ps = self.page_size
        held = self.table[row, : int(self.valid_lens[row]) : ps] // ps == page
        return int(np.argmax(held)) if held.any() else -1

    def _holds(self, page: int) -> np.ndarray:
        """``[max_reqs, max_pages]`` bool: row ``r``'s logical page ``j`` is ``page``."""
        ps = self.page_size
        firsts = np.arange(0, self.table.shape[1], ps)
        return (self.table[:, ::ps] // ps == page) & (firsts < self.valid_lens[:, None])

    def holder(self, slot: int, exclude: int = -1) -> int:
        """A row (other than ``exclude``) holding the page of ``slot``; -1 if none."""
        rows = self.holders(slot // self.page_size)
        rows = rows[rows != exclude]
        return int(rows[0]) if rows.size else -1

    # ---- state changes -------------------------------------------------------------------
    def commit(self, w: KVWrites) -> None:
        """Record an accepted step: rows truncated to ``starts``, then its positions added.

        ``check(w)`` must have passed: each written page is then, once the rows are truncated,
        free or already the writing row's own page for that logical page.
        """
        grew = True  # NOTE: the decode steady state: every row only grows
        if w.rows.size:
            valid = self.valid_lens[w.rows]
            if umax(valid - w.starts) > 0:
                if w.recorded and self._rewrites_same(w, valid):
                    return
                self._release(w.rows, w.starts, valid)
                grew = False
        if w.recorded and w.slots.size:
            rows = w.rows if w.per_row else w.rows[w.slot_req]
            self.table[rows, w.slot_pos] = w.slots
            # NOTE: every written page ends up held by its row alone (kept pages already
            # were): set without reading refs back.
            pages = w.slots // self.ps
            self.refs[pages] = 1
            self.key[pages * self.ps] = -1
        self.valid_lens[w.rows] = w.starts + w.counts
        if self.page_size == 1:
            return  # NOTE: every next position opens a page: the cursor stays ``open``
        if grew and w.per_row:
            self.cursor[w.rows] = self._after[w.slots]  # NOTE: its own page (checked)
        else:
            self._recursor(w.rows)

    def _recursor(self, rows: np.ndarray) -> None:
        """Work out the cursor of ``rows`` from their valid positions and pages."""
        valid = self.valid_lens[rows]
        last = self.table[rows, np.maximum(valid - 1, 0)].astype(np.int64)
        cursor = np.where(self.refs[last // self.ps] > 1, -2, last + 1)
        self.cursor[rows] = np.where(valid % self.ps == 0, self.open, cursor)

    def truncate(self, rows: np.ndarray, keep: np.ndarray) -> None:
        """Drop positions ``>= keep[i]`` of ``rows[i]`` and release the pages left empty."""
        if not rows.size:
            return
        valid = self.valid_lens[rows]
        if umax(valid - keep) <= 0:
            return
        self._release(rows, keep, valid)
        self.valid_lens[rows] = np.minimum(valid, keep)
        if self.page_size > 1:
            self._recursor(rows)

    def _rewrites_same(self, w: KVWrites, valid: np.ndarray) -> bool:
        """True (state unchanged) when the step rewrites exactly the positions it drops, each
        with the slot it already holds: releasing then re-adding them would change nothing.

        NOTE: a verify after a verify, or a step retried, rewrites its own tail with the slots
        the engine gave those positions before; this costs two gathers instead of a release
        plus a write (~4 µs).
        """
        if valid.tobytes() != (w.starts + w.counts).tobytes():
            return False
        rows = w.rows if w.per_row else w.rows[w.slot_req]
        return not any_true(self.table[rows, w.slot_pos] != w.slots)

    def _release(self, rows: np.ndarray, keep: np.ndarray, valid: np.ndarray) -> None:
        """Release the pages ``rows[i]`` holds past its first ``keep[i]`` positions (of
        ``valid[i]``); ``valid_lens`` is left to the caller."""
        lo = -(-keep // self.ps)  # NOTE: first logical page no position below keep lies in
        count = -(-valid // self.ps) - lo
        most = umax(count)
        if most <= 0:
            return
        if most == 1 and umin(count) == 1:
            # NOTE: one page per row (a step dropping its last page): one gather, no repeat.
            pages = self.table[rows, lo * self.ps] // self.ps
        else:
            count = np.maximum(count, 0)
            row = np.repeat(rows, count)
            lp = np.repeat(lo - np.cumsum(count) + count, count) + np.arange(row.size)
            pages = self.table[row, lp * self.ps] // self.ps
        if umax(self.refs[pages]) == 1:
            # NOTE: each page held by this row only, so none repeats: a plain assignment
            # (np.subtract.at costs several µs).
            self.refs[pages] = 0
            self.key[pages * self.ps] = self.open
            return
        # NOTE: subtract.at, not refs[pages] -= 1: rows sharing a prefix may release a page twice.
        np.subtract.at(self.refs, pages, 1)
        self.key[pages[self.refs[pages] == 0] * self.ps] = self.open

    def free(self, row: int) -> None:
        """Release every page of ``row``; it reads nothing until a step writes it again."""
        self.truncate(np.array([row]), np.zeros(1, dtype=np.int64))

    def share_prefix(self, src: int, dst: int, length: int) -> None:
        """``dst`` (freed first) holds ``src``'s positions ``0..length-1``, sharing their pages.

        Whole pages only: ``length`` must be a multiple of the page size (a partial page would
        be read by ``dst`` at positions it writes itself; :meth:`ReqToToken.share_prefix` can
        copy that page instead). Shared pages are read-only for every row holding them.
        """
        have, ps = int(self.valid_lens[src]), self.page_size
        if not 0 <= length <= have:
            raise KVIsolationError(
                f"share_prefix: row {src} has {have} valid position(s), cannot share {length}"
            )
        if src == dst:
            self.truncate(np.array([dst]), np.array([length]))
            return
        if length % ps:
            cut = length - length % ps
            raise KVIsolationError(
                f"share_prefix: length {length} is not a multiple of page_size {ps}: pages are "
                f"shared whole and read-only, so row {dst} could not write positions "
                f"{length}..{cut + ps - 1} of the page it would share; share {cut} position(s) "
                "and recompute the rest, or copy the page (ReqToToken.share_prefix(..., copy_into=page))"
            )
        self.free(dst)
        self.table[dst, :length] = self.table[src, :length]
        pages = self.table[src, :length:ps] // ps
        self.refs[pages] += 1  # NOTE: distinct pages (one per logical page)
        self.valid_lens[dst] = length
        if ps > 1:
            self._recursor(np.array([src, dst]))
