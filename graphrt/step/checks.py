"""The fast half of ``Batch.check``: a sufficient condition for a valid batch, allocation-light.

``fast_ok`` returns True only when every check of :meth:`Batch.check` would pass; when it
returns False the full check runs and raises with its usual message (so messages and their
order never change). Range checks are one unsigned ``max`` each (a negative int64 viewed as
uint64 is huge); distinctness writes each value's index into a reusable "stamp" table and
reads it back: a row that repeats finds a later index than its own; KV slots (millions of
possible values) are sorted instead. No ``np.unique``, no per-request Python loop.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from graphrt.step.hostops import any_true, arange, umax, umin
from graphrt.step.modes import MODES, ForwardMode


class BatchView(Protocol):
    """What the fast check reads of a :class:`graphrt.step.batch.Batch` (host int64 arrays).

    A view, not the class: ``batch.py`` and ``limits.py`` import this module (the fast check
    sits below both), so it names what it reads instead of importing them.
    """

    mode: ForwardMode
    input_ids: np.ndarray
    seq_lens: np.ndarray
    req_pool_indices: np.ndarray
    out_cache_loc: np.ndarray
    q_lens: np.ndarray

    @property
    def kv_positions(self) -> np.ndarray: ...


class LimitsView(Protocol):
    """What the fast check reads of :class:`graphrt.step.limits.Limits`."""

    max_reqs: int
    max_context_len: int
    page_size: int
    num_live_slots: int
    vocab_size: int | None


class Scratch:
    """Reusable host arrays of the fast check (one per :class:`~graphrt.step.limits.Limits`).

    ``rows`` is the request-row stamp table; KV slots are checked by sorting a fresh copy
    (:func:`distinct_below`: measured faster than a stamp table over millions of slots, whose
    scattered writes miss the cache, and than filling a reusable array first). ``geometry``
    caches each mode's geometry rule (``Batch.check``).
    """

    def __init__(self, max_reqs: int, num_live_slots: int, page_size: int = 1) -> None:
        #: ``page_size`` as a 0-d array (see :func:`aligned`).
        self.page = np.array(page_size, dtype=np.int64)
        self.rows = np.zeros(max(max_reqs, 1), dtype=np.int64)
        self.index = np.arange(max(max_reqs, 1), dtype=np.int64)
        self.geometry: dict[ForwardMode, Any] = {}


#: A dtype instance, not the class: ``view`` skips converting it.
_U64 = np.dtype(np.uint64)


def below(arr: np.ndarray, hi: int) -> bool:
    """``0 <= arr < hi`` elementwise (int64 ``arr``, non-empty), in one reduction."""
    return umax(arr.view(_U64)) < hi


def distinct_rows(rows: np.ndarray, scratch: Scratch) -> bool:
    """True when no request row repeats; ``rows`` already lie in ``[0, max_reqs)``."""
    n = rows.size
    if n < 2:
        return True
    index = scratch.index[:n]
    scratch.rows[rows] = index
    # NOTE: with a repeat, the later index wins in the table, so the earlier one reads back
    # wrong. Comparing raw bytes is a memcmp (array_equal goes through Python wrappers).
    return scratch.rows[rows].tobytes() == index.tobytes()


def distinct(values: np.ndarray) -> bool:
    """True when no value repeats (sort a copy, compare neighbours)."""
    if values.size < 2:
        return True
    ordered = np.sort(values)
    return not any_true(ordered[1:] == ordered[:-1])


def distinct_below(values: np.ndarray, hi: int) -> bool:
    """True when no value repeats and every value lies in ``[0, hi)``: one sorted copy gives
    both (its ends are the min and max), cheaper than :func:`below` plus :func:`distinct`."""
    n = values.size
    if n < 2:
        return n == 0 or 0 <= int(values[0]) < hi
    ordered = values.copy()  # NOTE: a fresh small copy sorts faster than filling a scratch
    ordered.sort()
    return int(ordered[0]) >= 0 and int(ordered[-1]) < hi and not any_true(ordered[1:] == ordered[:-1])


def fast_ok(batch: BatchView, limits: LimitsView, scratch: Scratch, fed: bool = False) -> bool:
    """True when ``batch`` passes every check of :meth:`Batch.check` after the geometry check.

    False means "run the full check" (which then raises or, rarely, passes). ``fed``: the
    input ids are ``FED`` placeholders (already checked), not token ids.
    """
    spec = MODES[batch.mode]
    seq, q, loc = batch.seq_lens, batch.q_lens, batch.out_cache_loc
    rows = batch.req_pool_indices
    if not below(rows, limits.max_reqs) or not distinct_rows(rows, scratch):
        return False
    steps = loc.size // batch.input_ids.size if spec.draft_steps else 1
    # NOTE: the last KV position of a request is seq_len - 1 (+ draft steps - 1).
    if umax(seq) + steps - 1 > limits.max_context_len:
        return False
    # NOTE: uniform modes reach here with every q_len equal (the geometry check ran first).
    if spec.ragged:
        if any_true(seq < q):
            return False
    elif umin(seq) < (1 if spec.draft_steps else int(q[0])):
        return False
    ps = limits.page_size
    live = limits.num_live_slots // ps * ps
    if not distinct_below(loc, live):
        return False
    # NOTE: without a vocabulary a token id still must not be negative (INT64_MAX as the bound).
    vocab = limits.vocab_size if limits.vocab_size is not None else INT64_MAX
    if not fed and not below(batch.input_ids, vocab):
        return False
    return ps == 1 or aligned(batch, scratch.page)


INT64_MAX = int(np.iinfo(np.int64).max)


def aligned(batch: BatchView, page: np.ndarray) -> bool:
    """``out_cache_loc % ps == kv_positions % ps`` for every entry (``page``: 0-d ``ps``).

    NOTE: ``page`` is a 0-d array, not an int: numpy 2 converts a Python scalar operand on
    every call; in-place and ``out=`` forms cost more than a fresh array
    at these sizes (measured). Remainders are >= 0 (numpy's % takes the divisor's sign).
    """
    spec, seq, loc = MODES[batch.mode], batch.seq_lens, batch.out_cache_loc
    if spec.draft_steps or spec.ragged:
        return umax((loc - batch.kv_positions) % page) == 0
    if batch.input_ids.size == seq.size:
        # NOTE: one token per request, at position seq_len - 1: aligned iff every
        # (slot - seq_len) % ps is ps - 1, i.e. their minimum is.
        return umin((loc - seq) % page) == int(page) - 1
    q = batch.input_ids.size // seq.size
    diff = loc.reshape(-1, q) - (seq - q)[:, None] - arange(q)
    return umax(diff.reshape(-1) % page) == 0
