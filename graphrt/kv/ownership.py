"""Page ownership checks of the KV ledger, and why a step is refused.

:meth:`graphrt.kv.ledger.KVLedger.check` answers the decode steady state itself (each row's
cursor); every other step comes here: :func:`check_pages` (recorded writes) and
:func:`check_scratch` (tree drafts) find *that* a step breaks a rule with a few vectorised
operations; only then do the rest of the functions work out which write is at fault and the
message naming the request, its position, and both pages or the row that holds the page.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from graphrt.step.hostops import any_true, arange


class KVIsolationError(ValueError):
    """A step would read KV its row has not written, or write a page it does not own alone."""


class PageState(Protocol):
    """What the checks read of a :class:`graphrt.kv.ledger.KVLedger`."""

    page_size: int
    ps: np.ndarray
    valid_lens: np.ndarray
    table: np.ndarray
    refs: np.ndarray

    def holders(self, page: int) -> np.ndarray: ...

    def logical_page(self, row: int, page: int) -> int: ...


def check_pages(ledger: PageState, w: Any, valid: np.ndarray) -> None:
    """Raise when a recorded write breaks page ownership (``valid``: ``[bs]`` before the step).

    Each write either *keeps* its logical page (the page starts below the row's first written
    position): it must go to the page the row holds there, held by it alone; or the step
    *opens* the page: its write at the page's first position (``off`` entries back) names the
    page for all of them, which must be free, or held by the writing row alone at a logical
    page the step drops (a verify rewriting its drafts).
    """
    ps, n = ledger.ps, w.slots.size
    pages = w.slots // ps
    off = w.slot_pos % ps
    first = w.slot_pos - off  # NOTE: the first position of each write's logical page
    rows = w.rows if w.per_row else w.rows[w.slot_req]
    held = ledger.table[rows, first]  # NOTE: the row's page there (if it holds ``first``)
    if w.per_row:
        kept = off != 0  # NOTE: one write per request, at its start
        bad = (held != w.slots - off) & kept
    else:
        kept = first < w.starts[w.slot_req]
        anchor = np.where(kept, held, w.slots.take(arange(n) - off, mode="clip"))
        bad = anchor != w.slots - off
    # NOTE: a kept page is held by its row alone (refs 1), an opened one by nobody (refs 0).
    refs = ledger.refs[pages]
    busy = refs != kept
    if any_true(busy):
        # NOTE: an opened page its row alone holds at this very logical page, dropped now.
        busy &= ~(~kept & (refs == 1) & (valid[w.slot_req] > first) & (held == w.slots - off))
        if any_true(busy):
            busy &= ~_own_dropped(ledger, w, valid, pages, kept)
    if any_true(bad) or any_true(busy):
        _refuse(ledger, w, pages, kept, bad, busy)


def check_scratch(ledger: PageState, w: Any, valid: np.ndarray) -> None:
    """Raise when a scratch write (a tree draft's, entering no row) lands in a page another
    row holds, a shared page, or a slot of a position its own row keeps.

    The only page a row holds that may take a scratch write at a position it keeps none of is
    its last page when partial (slots past its first written position), or one it drops now.
    """
    pages = w.slots // ledger.ps
    if not any_true(ledger.refs[pages]):
        return
    rows, starts = w.rows[w.slot_req], w.starts[w.slot_req]
    lo = np.maximum(starts - 1, 0) // ledger.ps * ledger.ps  # NOTE: the page of position start - 1
    partial = (starts % ledger.ps != 0) & (w.slots % ledger.ps >= starts % ledger.ps)
    mine = partial & (ledger.table[rows, lo] // ledger.ps == pages)
    bad = (ledger.refs[pages] > 0) & ~((ledger.refs[pages] == 1) & mine)
    if any_true(bad):
        bad &= ~_own_dropped(ledger, w, valid, pages, np.zeros_like(bad))
    if bad.any():
        t = int(np.argmax(bad))
        raise KVIsolationError(f"{_prefix(w, t)}, but {_taken(ledger, w, t, pages)}")


def _own_dropped(
    ledger: PageState, w: Any, valid: np.ndarray, pages: np.ndarray, kept: np.ndarray
) -> np.ndarray:
    """Per write: a page the step opens that its row alone holds at a logical page it drops.

    NOTE: a Python loop over the suspects only (opened pages some row holds): a verify after
    a verify rewriting its own drafts, else a step about to be refused.
    """
    ok = np.zeros(pages.size, dtype=bool)
    suspects = np.flatnonzero(~kept & (ledger.refs[pages] == 1))
    for t in suspects.tolist():
        i = int(w.slot_req[t])
        row, start, have = int(w.rows[i]), int(w.starts[i]), int(valid[i])
        j = ledger.logical_page(row, int(pages[t]))
        ok[t] = j >= 0 and start <= j * ledger.page_size < have
    return ok


def _refuse(
    ledger: PageState, w: Any, pages: np.ndarray, kept: np.ndarray, bad: np.ndarray, busy: np.ndarray
) -> None:
    """Raise for the first write in ``bad | busy``, naming both pages or the page's holder."""
    t = int(np.argmax(bad | busy))
    ps = ledger.page_size
    page, pos = int(pages[t]), int(w.slot_pos[t])
    j = pos // ps
    if kept[t]:
        other = int(ledger.table[int(w.rows[int(w.slot_req[t])]), j * ps]) // ps
    else:
        other = int(w.slots[t - pos % ps]) // ps
    mapped = (
        f"its logical page {j} (positions {j * ps}..{j * ps + ps - 1}) is page {other}, "
        f"{'kept from earlier steps' if kept[t] else 'written by this step'}"
    )
    if bad[t] and not ledger.refs[page]:
        raise KVIsolationError(
            f"{_prefix(w, t)} into page {page}, but {mapped}: one logical page maps to one "
            "physical page, the one attention reads through the page table"
        )
    # NOTE: a page some row holds is named first: that write would overwrite its KV.
    also = f"; {mapped}" if bad[t] else ""
    raise KVIsolationError(f"{_prefix(w, t)}, but {_taken(ledger, w, t, pages)}{also}")


def _prefix(w: Any, t: int) -> str:
    req = int(w.slot_req[t])
    slot, pos = int(w.slots[t]), int(w.slot_pos[t])
    return f"request {req} (row {int(w.rows[req])}) writes KV slot {slot} at position {pos}"


def _taken(ledger: PageState, w: Any, t: int, pages: np.ndarray) -> str:
    """Who holds the page of write ``t`` (the reason it may not be written)."""
    page, ps = int(pages[t]), ledger.page_size
    holders = ledger.holders(page).tolist()
    if len(holders) > 1:
        return (
            f"page {page} (slots {page * ps}..{page * ps + ps - 1}) is shared read-only by rows "
            f"{holders} (share_prefix): a shared page is never written"
        )
    who = holders[0] if holders else -1
    lo = max(ledger.logical_page(who, page), 0) * ps
    hi = min(lo + ps, int(ledger.valid_lens[who])) - 1
    if who == int(w.rows[int(w.slot_req[t])]):
        start = int(w.starts[int(w.slot_req[t])])
        return (
            f"page {page} holds positions {lo}..{hi} of its own row, which the step reads "
            f"(limit: writes start at {start})"
        )
    return (
        f"page {page} holds positions {lo}..{hi} of live row {who}; free that row "
        "(ReqToToken.free) before reusing its pages"
    )
