"""The page is the unit of ownership: a row's logical page maps to one physical page, a page
belongs to one row (or is shared read-only as a whole page), and every refusal leaves the KV
cache, ``req_to_token``, the ledger and the buffers bit-identical, graphed and eager."""

from __future__ import annotations

import numpy as np
import pytest

from graphrt.kv.ledger import KVIsolationError
from tests.kv.conftest import PAGE
from tests.kv.test_isolation import refused, step
from tests.support.util import Setup, prefill, slot_of

EAGER = pytest.mark.parametrize("eager", [False, True], ids=["graph", "eager"])


@EAGER
def test_a_row_cannot_split_one_logical_page_over_two_pages(setup: Setup, eager: bool) -> None:
    """Row 1 writes its position 5 into row 0's page: slot and offset check out, but attention
    would read row 1's page 0 through the page of its position 0, not this one."""
    prefill(setup, [0, 1], [3, 5], np.random.default_rng(1))
    into_row0 = slot_of(setup, 0, 5)  # offset 5 of row 0's first page, free
    mine = slot_of(setup, 1, 0) // PAGE
    refused(
        setup,
        step(setup, [1], [6], [into_row0]),
        eager,
        rf"request 0 \(row 1\) writes position 5 into page {into_row0 // PAGE}, but its page's first "
        rf"position 0 is in page {mine}: a row's logical page maps to one physical page",
    )


@EAGER
def test_a_row_cannot_start_its_page_in_a_page_another_row_holds(setup: Setup, eager: bool) -> None:
    prefill(setup, [0, 1], [3, PAGE], np.random.default_rng(2))
    theirs = slot_of(setup, 0, 0)  # offset 0 of row 0's page: row 1's position 16 would start there
    refused(setup, step(setup, [1], [PAGE + 1], [theirs]), eager, r"holds position 0 of live row 0")


def test_prefixes_are_shared_in_whole_pages(setup: Setup) -> None:
    prefill(setup, [0], [PAGE + 5], np.random.default_rng(3))
    r2t = setup.req_to_token
    with pytest.raises(
        KVIsolationError, match=rf"length {PAGE + 3} is not a multiple of page_size {PAGE}: .*share {PAGE}\)"
    ):
        r2t.share_prefix(0, 2, PAGE + 3)
    r2t.share_prefix(0, 2, PAGE)
    assert r2t.valid_lens[2] == PAGE and (r2t.ledger.refs[r2t.ledger.table[0, :PAGE]] == 2).all()
