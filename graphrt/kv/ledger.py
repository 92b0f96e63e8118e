"""Which KV each request row validly holds: host arrays behind the isolation checks.

A row's *valid length* counts the positions it has written since it was (re)assigned; every
live slot records the row that wrote it (``owner``), the position it holds (the same in every
row that shares it) and how many rows hold it (``refs``, > 1 only for shared prefixes).

A step that writes positions ``p … p+q-1`` of a row needs the row valid up to ``p`` and leaves
it valid up to ``p+q``: what the row held from ``p`` on is dropped and its slots released.
It may write a slot only when no live row holds it, save the writing row itself at a position
``>= p`` (dropped by this very step, as a verify rewrites its rejected drafts). Checks and
commits are vectorised over the step's tokens: no per-request Python loop on the hot path.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from graphrt.step.batch import Batch
from graphrt.step.hostops import any_true, arange, umax, umin
from graphrt.step.modes import MODES


class KVIsolationError(ValueError):
    """A step would read KV its row has not written, or write a slot another row holds."""


class KVWrites(NamedTuple):
    """What one step reads and writes (host int64 arrays).

    ``rows``, ``starts``, ``counts``: ``[bs]`` — request row, first position written (the step
    reads the row's positions ``< start``), positions written into the row. ``slots``,
    ``slot_req``, ``slot_pos``: ``[n]`` — every KV slot written, its request index, and its
    position. ``recorded=False``: scratch slots (tree drafts) that enter no row. ``per_row``:
    slot ``i`` belongs to request ``i`` (one write per request, at position ``starts[i]``), so the hot path skips the
    ``rows[slot_req]`` gathers. A named tuple, not a frozen dataclass: built every step, and
    a frozen dataclass's ``__init__`` pays for ``object.__setattr__`` calls.
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
        per_req = (
            batch.q_lens * batch.draft_steps if draft else batch.q_lens
        )  # NOTE: read-only, never written
        slot_req = np.repeat(arange(batch.bs), per_req)
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
    """Host state of ``max_reqs`` request rows over ``num_slots`` live KV slots."""

    def __init__(self, max_reqs: int, max_context_len: int, num_slots: int, page_size: int = 1) -> None:
        self.page_size = page_size
        self._ps = np.array(page_size, dtype=np.int64)  # NOTE: 0-d: numpy 2 converts ints per call
        self.valid_lens = np.zeros(max_reqs, dtype=np.int64)
        self.table = np.zeros((max_reqs, max_context_len), dtype=np.int32)  # host mirror of valid entries
        self.owner = np.full(num_slots, -1, dtype=np.int64)  # row that wrote the slot, -1: free
        self.refs = np.zeros(num_slots, dtype=np.int64)  # rows holding the slot
        self.slot_pos = np.zeros(num_slots, dtype=np.int64)  # position the slot holds
        #: Slots a prefix cache pins (one of their ``refs``), read-only: :mod:`graphrt.kv.pins`.
        self.pinned = np.zeros(num_slots, dtype=bool)

    # ---- checks (raise before anything is written) ---------------------------------------
    def check(self, w: KVWrites) -> np.ndarray:
        """Raise :class:`KVIsolationError` naming the request, the position and the limit.

        Returns ``[bs]`` int64: the positions each row drops (``valid_lens[rows] - starts``),
        which :meth:`commit` takes back while the ledger is unchanged (it then skips a gather).
        """
        valid = self.valid_lens[w.rows]
        drop = valid - w.starts
        if w.rows.size and umin(drop) < 0:
            i = int(np.argmax(drop < 0))
            row, start, have = int(w.rows[i]), int(w.starts[i]), int(valid[i])
            raise KVIsolationError(
                f"request {i} (row {row}) reads KV positions 0..{start - 1}, but row {row} has written "
                f"only {have} position(s) since it was assigned: position {have} holds no KV of "
                f"this request (limit {have})"
            )
        refs = self.refs[w.slots]
        if any_true(refs):
            self._check_slots(w, refs, valid)
        if self.page_size > 1 and w.recorded and w.slots.size:
            self._check_pages(w)
        return drop

    def _check_pages(self, w: KVWrites) -> None:
        """The page is the unit of ownership: a row's logical page maps to one physical page.

        A write inside a page (``pos % page_size != 0``) must land in the page of the row's
        write at the page's first position (held, or written by this step: a request's writes
        are in position order). With the slot check this also keeps a row out of another
        row's page: offset 0 of a page with live slots is live (positions fill pages from
        their start, prefixes are shared in whole pages), so starting a page there is refused
        by the slot check, and writing inside it by this one.
        """
        rows = w.rows if w.per_row else w.rows[w.slot_req]
        pos, slots, ps = w.slot_pos, w.slots, self._ps
        within = np.remainder(pos, ps)
        page = np.floor_divide(slots, ps)
        first = pos - within
        inner = within > 0
        if any_true(inner):
            # NOTE: int32 // a 0-d int64 gives int64: no astype copy needed.
            first_slot = self.table[rows, first]
            if not w.per_row:
                # NOTE: one write per request (per_row) writes at its start, so an inner write's
                # page start lies before it (held): only longer writes may start a page themselves.
                first_slot = first_slot.astype(np.int64)
                fresh = inner & (first >= w.starts[w.slot_req])
                if any_true(fresh):  # NOTE: the page's first position is written by this step
                    k = np.flatnonzero(fresh)
                    first_slot[k] = slots[k - within[k]]
            bad = inner & (np.floor_divide(first_slot, ps) != page)
            if any_true(bad):
                t = int(np.argmax(bad))
                raise KVIsolationError(
                    f"request {int(w.slot_req[t])} (row {int(rows[t])}) writes position {int(pos[t])} into "
                    f"page {int(page[t])}, but its page's first position {int(first[t])} is in page "
                    f"{int(first_slot[t]) // self.page_size}: a row's logical page maps to one physical page"
                )

    def _check_slots(self, w: KVWrites, refs: np.ndarray, valid: np.ndarray) -> None:
        # NOTE: one write per request: slot i is request i's, so the per-slot gathers are views.
        if w.per_row:
            rows, starts, row_valid = w.rows, w.starts, valid
        else:
            rows, starts, row_valid = w.rows[w.slot_req], w.starts[w.slot_req], valid[w.slot_req]
        held = self.slot_pos[w.slots]
        # NOTE: the only holder allowed is the writing row itself at a position it drops now.
        mine = (held >= starts) & (held < row_valid) & (self.table[rows, held] == w.slots)
        bad = refs > mine
        if not any_true(bad):
            return
        t = int(np.argmax(bad))
        i, slot, pos = int(w.slot_req[t]), int(w.slots[t]), int(held[t])
        holder = self.holder(slot, exclude=int(rows[t]) if mine[t] else -1)
        what = (
            f"position {pos} of its own row, which the step reads (limit: writes start at {int(starts[t])})"
            if holder == int(rows[t])
            else f"position {pos} of live row {holder}; free that row (ReqToToken.free) before reusing its slots"
        )
        if self.pinned[slot] and holder != int(rows[t]):
            what = (
                f"position {pos} of a cached prefix page (pinned, read-only: shared pages are never written)"
            )
        raise KVIsolationError(
            f"request {i} (row {int(rows[t])}) writes KV slot {slot} at position {int(w.slot_pos[t])}, "
            f"but slot {slot} holds {what}"
        )

    def holder(self, slot: int, exclude: int = -1) -> int:
        """A row (other than ``exclude``) whose valid positions hold ``slot``; -1 if none."""
        pos = int(self.slot_pos[slot])
        hold = (self.table[:, pos] == slot) & (self.valid_lens > pos)
        if 0 <= exclude < hold.size:
            hold[exclude] = False
        return int(np.argmax(hold)) if hold.any() else -1

    # ---- state changes -------------------------------------------------------------------
    def commit(self, w: KVWrites, drop: np.ndarray | None = None) -> None:
        """Record an accepted step: rows truncated to ``starts``, then its positions added.

        ``check(w)`` must have passed: every slot the step writes is then free once the rows
        are truncated (the only holder it allows is the writing row at a position it drops).
        ``drop``: what that check returned, when nothing changed the ledger since.
        """
        if w.rows.size:
            extra = self.valid_lens[w.rows] - w.starts if drop is None else drop
            if umax(extra) > 0:  # NOTE: the decode steady state skips this: rows only grow
                valid = extra + w.starts
                if w.recorded and self._rewrites_same(w, valid):
                    return
                self._release(w.rows, w.starts, extra)
        if w.recorded and w.slots.size:
            rows = w.rows if w.per_row else w.rows[w.slot_req]
            self.table[rows, w.slot_pos] = w.slots
            # NOTE: free (checked) and distinct within a batch (Batch.check): one holder each,
            # set without reading refs back (refs[slots] += 1 costs more).
            self.refs[w.slots] = 1
            self.owner[w.slots] = rows
            self.slot_pos[w.slots] = w.slot_pos
        self.valid_lens[w.rows] = w.starts + w.counts

    def truncate(self, rows: np.ndarray, keep: np.ndarray) -> None:
        """Drop positions ``>= keep[i]`` of ``rows[i]`` and release the slots they held."""
        if not rows.size:
            return
        valid = self.valid_lens[rows]
        extra = valid - keep
        if umax(extra) <= 0:
            return
        self._release(rows, keep, extra)
        self.valid_lens[rows] = np.minimum(valid, keep)

    def _rewrites_same(self, w: KVWrites, valid: np.ndarray) -> bool:
        """True (and the state updated) when the step rewrites exactly the positions it drops,
        each with the slot it already holds: releasing then re-adding them would change nothing.

        NOTE: a verify after a verify, or a step retried, rewrites its own tail with the slots
        the engine gave those positions before; this costs two gathers instead of a release
        plus a write.
        """
        if valid.tobytes() != (w.starts + w.counts).tobytes():
            return False
        rows = w.rows if w.per_row else w.rows[w.slot_req]
        if any_true(self.table[rows, w.slot_pos] != w.slots):
            return False
        # NOTE: refs, slot_pos and valid_lens already hold the result (check() allowed no other
        # holder); owner may still name the row that shared the slot into this one.
        self.owner[w.slots] = rows
        return True

    def _release(self, rows: np.ndarray, keep: np.ndarray, extra: np.ndarray) -> None:
        """Release the slots at positions ``keep[i] .. keep[i] + extra[i] - 1`` of ``rows[i]``
        (``extra`` < 1: nothing); ``valid_lens`` is left to the caller."""
        if umax(extra) == 1:
            # NOTE: at most one position per row (a decode step rewriting its last token):
            # one gather, no repeat / cumsum.
            if umin(extra) == 1:
                slots = self.table[rows, keep]
            else:
                drop = extra == 1
                slots = self.table[rows[drop], keep[drop]]
        else:
            extra = np.maximum(extra, 0)
            row = np.repeat(rows, extra)
            first = np.repeat(keep - np.cumsum(extra) + extra, extra)
            slots = self.table[row, first + np.arange(row.size)]
        refs = self.refs[slots]
        if umax(refs) == 1:
            # NOTE: each slot held by this one position only, so no slot repeats in ``slots``:
            # a plain assignment (np.subtract.at costs several µs).
            self.refs[slots] = 0
            self.owner[slots] = -1
            return
        # NOTE: subtract.at, not refs[slots] -= 1: rows sharing a prefix may release one slot twice.
        np.subtract.at(self.refs, slots, 1)
        self.owner[slots[self.refs[slots] == 0]] = -1

    def free(self, row: int) -> None:
        """Release every slot of ``row``; it reads nothing until a step writes it again."""
        self.truncate(np.array([row]), np.zeros(1, dtype=np.int64))

    def share_prefix(self, src: int, dst: int, length: int) -> None:
        """``dst`` (freed first) holds ``src``'s positions ``0..length-1``, sharing their slots.

        Whole pages only: a partial last page would be read by ``dst`` through the same page
        as ``src``'s later positions (refused; copy the partial page's KV into a page of
        ``dst``'s own and share ``length - length % page_size``).
        """
        if not 0 <= length <= self.valid_lens[src]:
            raise KVIsolationError(
                f"share_prefix: row {src} has {int(self.valid_lens[src])} valid position(s), "
                f"cannot share {length}"
            )
        if length % self.page_size and src != dst:
            raise KVIsolationError(
                f"share_prefix: length {length} is not a multiple of page_size {self.page_size}: "
                f"prefixes are shared in whole pages (share {length - length % self.page_size})"
            )
        if src == dst:
            self.truncate(np.array([dst]), np.array([length]))
            return
        self.free(dst)
        slots = self.table[src, :length]
        self.table[dst, :length] = slots
        self.refs[slots] += 1
        self.valid_lens[dst] = length
