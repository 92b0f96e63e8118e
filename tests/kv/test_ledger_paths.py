"""The ledger's shortcuts leave the state and the refusals of its general path: ``check`` hands
``commit`` the positions each row drops, and a one-write-per-request step (``per_row``) skips
the page check's fresh-page branch."""

from __future__ import annotations

import numpy as np
import pytest

from graphrt.kv.ledger import KVIsolationError, KVLedger, KVWrites

STATE = ("valid_lens", "table", "owner", "refs", "slot_pos")
PS = 4


def one_each(rows: list[int], starts: list[int], slots: list[int], per_row: bool = True) -> KVWrites:
    """One write per request: row ``rows[i]`` writes ``slots[i]`` at position ``starts[i]``."""
    r, s = np.array(rows, dtype=np.int64), np.array(starts, dtype=np.int64)
    n = r.size
    return KVWrites(r, s, np.ones(n, np.int64), np.array(slots, np.int64), np.arange(n), s, True, per_row)


def held(ps: int = 1) -> KVLedger:
    """Rows 0 and 1 hold positions 0..2 in slots 20..22 and 40..42 (pages 5 and 10 at ps 4)."""
    ledger = KVLedger(4, 64, 256, ps)
    for row, base in ((0, 20), (1, 40)):
        for pos in range(3):
            w = one_each([row], [pos], [base + pos])
            ledger.commit(w, ledger.check(w))
    return ledger


@pytest.mark.parametrize(
    ("starts", "slots", "drop"),
    [([3, 3], [23, 43], [0, 0]), ([2, 3], [22, 43], [1, 0]), ([1, 2], [30, 50], [2, 1])],
    ids=["append", "rewrite-same", "rewrite-other"],
)
def test_commit_with_the_checks_drop_equals_commit_alone(starts, slots, drop) -> None:
    a, b = held(), held()
    w = one_each([0, 1], starts, slots)
    got = a.check(w)
    np.testing.assert_array_equal(got, drop)
    assert got.dtype == np.int64
    a.commit(w, got)
    b.check(w)
    b.commit(w)
    for name in STATE:
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name), err_msg=name)
    np.testing.assert_array_equal(a.valid_lens[:2], np.array(starts) + 1)


def test_a_short_row_is_refused_with_its_limit() -> None:
    ledger = held()
    with pytest.raises(
        KVIsolationError, match=r"request 1 \(row 1\) reads KV positions 0\.\.4, .* \(limit 3\)"
    ):
        ledger.check(one_each([0, 1], [3, 5], [23, 45]))


def test_an_empty_step_drops_nothing() -> None:
    ledger = held()
    empty = np.zeros(0, np.int64)
    w = KVWrites(empty, empty, empty, empty, empty, empty)
    assert ledger.check(w).size == 0
    ledger.commit(w, ledger.check(w))
    np.testing.assert_array_equal(ledger.valid_lens, [3, 3, 0, 0])


@pytest.mark.parametrize("per_row", [True, False], ids=["per-row", "general"])
def test_page_check_refuses_a_write_into_another_page_on_both_paths(per_row: bool) -> None:
    """Position 3 of row 0 (offset 3) must land in page 5, where its position 0 lies."""
    ledger = held(PS)
    ledger.check(one_each([0, 1], [3, 3], [23, 43], per_row))  # pages 5 and 10: accepted
    with pytest.raises(
        KVIsolationError,
        match=r"request 1 \(row 1\) writes position 3 into page 6, but its page's first position 0 "
        r"is in page 10: a row's logical page maps to one physical page",
    ):
        ledger.check(one_each([0, 1], [3, 3], [23, 27], per_row))
    for name in STATE:  # NOTE: a refusal changes nothing
        np.testing.assert_array_equal(getattr(ledger, name), getattr(held(PS), name), err_msg=name)
