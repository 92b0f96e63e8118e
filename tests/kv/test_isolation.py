"""KV isolation: a step reads only positions its row wrote and writes no slot another row holds.

Both cases of issue 12 are refused with an error naming the request, the position and the
limit, graphed and eager, and the KV cache, ``req_to_token`` and every buffer are unchanged.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from graphrt import Batch, ForwardMode
from graphrt.kv.ledger import KVIsolationError
from tests.support.state import assert_same_state, state_of
from tests.support.util import Setup, decode_batch, prefill, slot_of


def refused(s: Setup, batch: Batch, eager: bool, message: str) -> None:
    """``batch`` raises ``KVIsolationError`` matching ``message`` and changes nothing."""
    before, stats = state_of(s.runtime), s.runtime.stats()
    with pytest.raises(KVIsolationError, match=message):
        s.runtime.run(batch, eager=eager)
    assert_same_state(s.runtime, before)
    assert s.runtime.stats() == stats


def step(s: Setup, rows: list[int], lens: list[int], locs: list[int]) -> Batch:
    return Batch.create(
        ForwardMode.DECODE,
        input_ids=[7] * len(rows),
        seq_lens=lens,
        req_pool_indices=rows,
        out_cache_loc=locs,
    )


@pytest.mark.parametrize("eager", [False, True], ids=["graph", "eager"])
def test_reused_row_cannot_read_the_previous_requests_kv(setup: Setup, eager: bool) -> None:
    """A fills row 0 with 40 tokens and finishes; B prefills 3 tokens into row 0, then asks
    for seq_len 41: the step would attend 37 slots of A's KV."""
    rng = np.random.default_rng(0)
    prefill(setup, [0], [40], rng)
    prefill(setup, [0], [3], rng)  # B: no explicit free, its prefill from 0 starts clean
    assert setup.req_to_token.valid_lens[0] == 3
    bad = decode_batch(setup, [0], [41], rng)
    refused(setup, bad, eager, r"request 0 \(row 0\) reads KV positions 0\.\.39.*written only 3 position")
    setup.runtime.run(decode_batch(setup, [0], [4], rng), eager=eager)  # the honest step runs
    assert setup.req_to_token.valid_lens[0] == 4


@pytest.mark.parametrize("eager", [False, True], ids=["graph", "eager"])
def test_row_never_prefilled_reads_nothing(setup: Setup, eager: bool) -> None:
    rng = np.random.default_rng(1)
    prefill(setup, [0], [30], rng)
    refused(setup, decode_batch(setup, [1], [20], rng), eager, r"request 0 \(row 1\).*\(limit 0\)")
    # the offending request is named by its index in the batch
    batch = decode_batch(setup, [0, 1], [31, 20], rng)
    refused(setup, batch, eager, r"request 1 \(row 1\) reads KV positions 0\.\.18")


@pytest.mark.parametrize("eager", [False, True], ids=["graph", "eager"])
def test_step_cannot_write_a_slot_of_another_live_row(setup: Setup, eager: bool) -> None:
    """Row 2 writes a slot live row 0 holds: row 0's KV would be overwritten."""
    rng = np.random.default_rng(2)
    prefill(setup, [0, 2], [40, 1], rng)
    theirs = slot_of(setup, 0, 17)  # page-aligned for row 2's position 1
    bad = step(setup, [2], [2], [theirs])
    refused(
        setup,
        bad,
        eager,
        rf"request 0 \(row 2\) writes KV slot {theirs} at position 1, .*position 17 of live row 0",
    )
    setup.req_to_token.free(0)  # once row 0 is freed its slots are free, but not this page's half
    page = theirs // setup.req_to_token.ledger.page_size
    refused(
        setup, bad, eager, rf"writes position 1 into page {page}, but its page's first position 0 is in page"
    )


@pytest.mark.parametrize("eager", [False, True], ids=["graph", "eager"])
def test_step_cannot_overwrite_its_own_prefix(setup: Setup, eager: bool) -> None:
    rng = np.random.default_rng(3)
    prefill(setup, [0], [20], rng)
    bad = step(setup, [0], [21], [slot_of(setup, 0, 4)])  # position 20 -> slot of position 4
    refused(setup, bad, eager, r"holds position 4 of its own row, which the step reads")


def test_freed_row_reads_nothing(setup: Setup) -> None:
    rng = np.random.default_rng(4)
    prefill(setup, [0], [10], rng)
    setup.req_to_token.free(0)
    assert setup.req_to_token.valid_lens[0] == 0
    assert (setup.req_to_token.ledger.owner[: slot_of(setup, 0, 10)] == -1).all()
    refused(setup, decode_batch(setup, [0], [11], rng), False, r"row 0 has written only 0")


def test_reused_row_prefill_releases_the_old_slots(setup: Setup) -> None:
    """A new prefill from 0 drops what the row held beyond it: another row may take those slots."""
    rng = np.random.default_rng(5)
    prefill(setup, [0, 1], [40, 16], rng)
    prefill(setup, [0], [3], rng)
    ledger = setup.req_to_token.ledger
    assert ledger.owner[slot_of(setup, 0, 2)] == 0 and ledger.owner[slot_of(setup, 0, 3)] == -1
    setup.runtime.run(step(setup, [1], [17], [slot_of(setup, 0, 16)]))
    assert ledger.owner[slot_of(setup, 0, 16)] == 1


def test_rewrites_of_own_tail_are_allowed(setup: Setup) -> None:
    """A verify writes 4 positions; the next step rewrites from the first rejected one, with
    the same slots (the engine's verify → verify pattern), and releases the rest."""
    rng = np.random.default_rng(6)
    prefill(setup, [0], [10], rng)
    extend = Batch.create(
        ForwardMode.EXTEND,
        input_ids=[1, 2, 3, 4],
        seq_lens=[14],
        req_pool_indices=[0],
        out_cache_loc=[slot_of(setup, 0, p) for p in range(10, 14)],
        q_lens=[4],
    )
    setup.runtime.run(extend)
    setup.runtime.run(step(setup, [0], [12], [slot_of(setup, 0, 11)]))
    ledger = setup.req_to_token.ledger
    assert setup.req_to_token.valid_lens[0] == 12
    assert ledger.owner[[slot_of(setup, 0, p) for p in (11, 12, 13)]].tolist() == [0, -1, -1]


def test_shared_prefix_reads_the_source_rows_kv(setup: Setup) -> None:
    """Row 3 shares row 0's first 16 positions: its step equals row 0's own step, and neither
    row may write a shared slot while the other holds it."""
    rng = np.random.default_rng(7)
    prefill(setup, [0], [20], rng)
    setup.req_to_token.share_prefix(0, 3, 16)
    assert setup.req_to_token.valid_lens[3] == 16
    mine = setup.runtime.run(step(setup, [3], [17], [slot_of(setup, 3, 16)]))
    theirs = setup.runtime.run(step(setup, [0], [17], [slot_of(setup, 0, 16)]), eager=True)
    torch.testing.assert_close(mine, theirs, atol=2e-2 if mine.dtype != torch.float32 else 1e-5, rtol=0)
    shared = slot_of(setup, 0, 5)
    refused(setup, step(setup, [3], [6], [shared]), False, rf"slot {shared} holds position 5 of live row 0")
    refused(setup, step(setup, [0], [6], [shared]), True, rf"slot {shared} holds position 5 of live row 3")
    setup.req_to_token.free(0)  # row 3 still holds the prefix
    assert setup.req_to_token.ledger.refs[shared] == 1
    prefill(setup, [1], [5], rng)
    refused(setup, step(setup, [1], [6], [shared]), False, r"live row 3")


def test_share_prefix_checks_its_arguments(setup: Setup) -> None:
    prefill(setup, [0], [8], np.random.default_rng(8))
    with pytest.raises(KVIsolationError, match=r"row 0 has 8 valid position\(s\), cannot share 9"):
        setup.req_to_token.share_prefix(0, 1, 9)
    with pytest.raises(ValueError, match=r"dst 4 out of range \[0, 4\)"):
        setup.req_to_token.share_prefix(0, 4, 2)
    with pytest.raises(ValueError, match=r"row -1 out of range"):
        setup.req_to_token.free(-1)


def test_engine_frees_rows_of_finished_requests() -> None:
    """The engine frees a finished request's row in target and draft, so later requests reuse
    its row and pages (a prompt per row and more prompts than rows)."""
    from graphrt import Engine

    spec = {"draft_model": "tiny-llama-draft", "num_steps": 2}
    engine = Engine("tiny-llama", device="cpu", max_batch_size=2, max_context_len=48, speculative=spec)
    prompts = [[1 + i, 2, 3, 4 + i] for i in range(5)]
    assert engine.generate(prompts, max_new_tokens=6) == [engine.generate([p], 6)[0] for p in prompts]
    assert engine.spec is not None
    for runtime in (engine.runtime, engine.spec.draft):
        assert runtime.req_to_token.valid_lens.tolist() == [0, 0]
        assert (runtime.req_to_token.ledger.owner == -1).all() and not runtime.req_to_token.ledger.refs.any()
