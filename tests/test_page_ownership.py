"""Issue 24.1: the page is the unit of KV ownership, graphed and eager.

Attention finds position ``p`` through the row's page-table entry for ``p``'s page, taken from
the page's first position. So a row writing the positions of one logical page into two
physical pages, or into a page another row holds, would read KV the ledger never gave it.
Each such step is refused naming the request, the position and both pages, and changes
nothing; ``share_prefix`` shares whole pages, or copies the partial last one.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from graphrt import Batch, ForwardMode
from graphrt.kv.ledger import KVIsolationError
from tests.state import assert_same_state, state_of
from tests.test_isolation import refused, step
from tests.util import Setup, build_runtime, prefill, slot_of

PAGE, CONTEXT, ROWS = 16, 64, 4
EAGER = pytest.mark.parametrize("eager", [False, True], ids=["graph", "eager"])


_CACHE: dict[str, Setup] = {}


@pytest.fixture
def setup(device: torch.device) -> Setup:
    """One captured runtime per device, every row freed: each test prefills what it reads."""
    if device.type not in _CACHE:
        _CACHE[device.type] = build_runtime(
            device, page_size=PAGE, max_context_len=CONTEXT, max_reqs=ROWS, buckets=(1, 2)
        )
    s = _CACHE[device.type]
    for row in range(ROWS):
        s.req_to_token.free(row)
    return s


def extend(s: Setup, row: int, start: int, tokens: list[int], slots: list[int]) -> Batch:
    """Row ``row`` writes positions ``start ..`` with ``tokens`` at ``slots``."""
    n = len(tokens)
    return Batch.create(
        ForwardMode.EXTEND,
        input_ids=tokens,
        seq_lens=[start + n],
        req_pool_indices=[row],
        out_cache_loc=slots,
        q_lens=[n],
    )


@EAGER
def test_row_cannot_write_into_another_rows_page(setup: Setup, eager: bool) -> None:
    """Row 1 writes its position 5 into row 0's page 0 (slot aligned, free): refused, naming
    row 0's page and row 1's own page for that logical page."""
    rng = np.random.default_rng(0)
    prefill(setup, [0, 1], [5, 5], rng)
    theirs = slot_of(setup, 0, 5)  # page 0, where row 0 holds positions 0..4
    refused(
        setup,
        step(setup, [1], [6], [theirs]),
        eager,
        rf"request 0 \(row 1\) writes KV slot {theirs} at position 5, but page 0 holds positions "
        r"0\.\.4 of live row 0; .*its logical page 0 \(positions 0\.\.15\) is page 4",
    )


@EAGER
def test_row_cannot_split_a_logical_page_over_two_pages(setup: Setup, eager: bool) -> None:
    """Row 0 writes its position 5 into a free page: its page-table entry for page 0 still
    names page 0, so the step would read an unwritten slot there. Refused naming both pages,
    also when the split happens inside one step (a prefill spanning two pages for page 0)."""
    rng = np.random.default_rng(1)
    prefill(setup, [0], [5], rng)
    elsewhere = slot_of(setup, 2, 5)  # page 8, free, aligned with position 5
    refused(
        setup,
        step(setup, [0], [6], [elsewhere]),
        eager,
        rf"request 0 \(row 0\) writes KV slot {elsewhere} at position 5 into page 8, but its logical "
        r"page 0 \(positions 0\.\.15\) is page 0, kept from earlier steps",
    )
    split = [slot_of(setup, 3, p) for p in range(3)] + [slot_of(setup, 2, p) for p in range(3, 6)]
    refused(
        setup,
        extend(setup, 3, 0, [1] * 6, split),
        eager,
        r"request 0 \(row 3\) writes KV slot 131 at position 3 into page 8, but its logical page 0 "
        r"\(positions 0\.\.15\) is page 12, written by this step",
    )
    setup.runtime.run(step(setup, [0], [6], [slot_of(setup, 0, 5)]), eager=eager)  # its own page


@EAGER
def test_logits_do_not_depend_on_another_rows_tokens(setup: Setup, eager: bool) -> None:
    """The attack of the issue, run to the end: rows 0 and 2 hold the same prompt; whatever
    row 1 tries to write into row 0's page, row 0's next logits equal row 2's."""
    rng = np.random.default_rng(2)
    prompt = [int(t) for t in rng.integers(0, setup.model.vocab_size, 5)]
    for row in (0, 2):
        setup.runtime.run(extend(setup, row, 0, prompt, [slot_of(setup, row, p) for p in range(5)]))
    prefill(setup, [1], [5], rng)
    for token in (3, 11):
        attack = Batch.create(
            ForwardMode.DECODE, input_ids=[token], seq_lens=[6], req_pool_indices=[1], out_cache_loc=[5]
        )
        with pytest.raises(KVIsolationError, match="live row 0"):
            setup.runtime.run(attack, eager=eager)
        with pytest.raises(KVIsolationError, match="into page 12, but its logical page 0"):
            setup.runtime.run(step(setup, [0], [6], [slot_of(setup, 3, 5)]), eager=eager)
    mine = setup.runtime.run(step(setup, [0], [6], [slot_of(setup, 0, 5)]), eager=eager)
    twin = setup.runtime.run(step(setup, [2], [6], [slot_of(setup, 2, 5)]), eager=eager)
    torch.testing.assert_close(mine, twin, atol=1e-5 if mine.dtype == torch.float32 else 2e-2, rtol=0)


def test_share_prefix_refuses_a_partial_page(setup: Setup) -> None:
    """Sharing 20 positions of 16-slot pages would share page 1 while row 3 writes its own
    positions 20.. into it: refused, naming the length and the page size; nothing changes."""
    prefill(setup, [0], [24], np.random.default_rng(3))
    before = state_of(setup.runtime)
    with pytest.raises(KVIsolationError, match=r"length 20 is not a multiple of page_size 16.*share 16"):
        setup.req_to_token.share_prefix(0, 3, 20)
    assert_same_state(setup.runtime, before)
    with pytest.raises(KVIsolationError, match=r"copy_into page 1 is held by live row 0"):
        setup.req_to_token.share_prefix(0, 3, 20, copy_into=1, kv=setup.kv)
    assert_same_state(setup.runtime, before)


@EAGER
def test_share_prefix_copies_the_partial_page(setup: Setup, eager: bool) -> None:
    """``copy_into``: page 0 is shared, page 1's first 4 positions are copied into row 3's
    page 13 on the device. Row 3 then reads the same KV as row 0 at those positions, and
    row 0 rewriting its own page 1 afterwards does not change what row 3 reads."""
    rng = np.random.default_rng(4)
    prefill(setup, [0], [20], rng)
    own = slot_of(setup, 3, 16) // PAGE
    setup.req_to_token.share_prefix(0, 3, 20, copy_into=own, kv=setup.kv)
    ledger = setup.req_to_token.ledger
    assert ledger.holders(0).tolist() == [0, 3] and ledger.holders(own).tolist() == [3]
    assert ledger.holders(1).tolist() == [0]
    mine = setup.runtime.run(step(setup, [3], [21], [slot_of(setup, 3, 20)]), eager=eager)
    theirs = setup.runtime.run(step(setup, [0], [21], [slot_of(setup, 0, 20)]), eager=eager)
    torch.testing.assert_close(mine, theirs, atol=2e-2 if mine.dtype != torch.float32 else 1e-5, rtol=0)
    new_tokens = [int(t) for t in rng.integers(0, setup.model.vocab_size, 4)]
    setup.runtime.run(extend(setup, 0, 16, new_tokens, [slot_of(setup, 0, p) for p in range(16, 20)]))
    again = setup.runtime.run(step(setup, [3], [21], [slot_of(setup, 3, 20)]), eager=eager)
    assert torch.equal(mine, again), "row 3 read row 0's rewritten page"
    with pytest.raises(KVIsolationError, match=r"shared read-only by rows \[0, 3\]"):
        setup.runtime.run(step(setup, [3], [16], [slot_of(setup, 0, 15)]), eager=eager)
