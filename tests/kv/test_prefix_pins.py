"""Attacks on cached prefix pages (:mod:`graphrt.kv.pins`): a request that writes into a shared
page, one that reads past its prefix, the eviction of a page in use. Each is refused before
anything is written: the KV cache, ``req_to_token``, the ledger and the buffers stay
bit-identical, graphed and eager."""

from __future__ import annotations

import numpy as np
import pytest

from graphrt.kv.ledger import KVIsolationError
from tests.kv.conftest import PAGE
from tests.kv.test_isolation import refused, step
from tests.support.state import assert_same_state, state_of
from tests.support.util import Setup, decode_batch, prefill, slot_of

EAGER = pytest.mark.parametrize("eager", [False, True], ids=["graph", "eager"])
CACHED = 2 * PAGE  # row 0's first two pages are cached


def cached_prefix(setup: Setup) -> np.ndarray:
    """Row 0 prefills 40 tokens; its first two pages are pinned (cached), then row 0 is freed
    and row 1 adopts them. Returns the cached slots ``[CACHED]``."""
    prefill(setup, [0], [40], np.random.default_rng(0))
    slots = np.array([slot_of(setup, 0, p) for p in range(CACHED)], dtype=np.int64)
    r2t = setup.req_to_token
    r2t.pin(slots, np.arange(CACHED))
    r2t.free(0)
    r2t.adopt(1, slots)
    return slots


def test_an_adopted_prefix_is_the_cached_kv(setup: Setup) -> None:
    slots = cached_prefix(setup)
    r2t, ledger = setup.req_to_token, setup.req_to_token.ledger
    assert r2t.valid_lens[1] == CACHED and r2t.valid_lens[0] == 0
    assert (r2t.table[1, :CACHED].cpu().numpy() == slots).all()
    assert (ledger.refs[slots] == 2).all() and ledger.pinned[slots].all()
    # the request goes on from its prefix in a page of its own
    setup.runtime.run(decode_batch(setup, [1], [CACHED + 1], np.random.default_rng(1)))
    assert r2t.valid_lens[1] == CACHED + 1


@EAGER
def test_a_request_cannot_write_into_a_shared_page(setup: Setup, eager: bool) -> None:
    slots = cached_prefix(setup)
    # the row holding the prefix rewrites its position 5 (a step from position 5 on)
    refused(setup, step(setup, [1], [6], [int(slots[5])]), eager, r"position 5 of a cached prefix page")
    # another row starts its own first page in the cached page
    refused(setup, step(setup, [2], [1], [int(slots[0])]), eager, r"position 0 of a cached prefix page")


@EAGER
def test_a_cached_page_no_row_holds_is_still_read_only(setup: Setup, eager: bool) -> None:
    slots = cached_prefix(setup)
    setup.req_to_token.free(1)
    assert (setup.req_to_token.ledger.refs[slots] == 1).all()  # the cache's pin only
    refused(setup, step(setup, [3], [1], [int(slots[PAGE])]), eager, r"position 16 of a cached prefix page")


@EAGER
def test_a_request_cannot_read_past_its_prefix(setup: Setup, eager: bool) -> None:
    cached_prefix(setup)
    bad = decode_batch(setup, [1], [CACHED + 8], np.random.default_rng(2))
    refused(setup, bad, eager, rf"request 0 \(row 1\) reads KV positions 0\.\.{CACHED + 6}.*limit {CACHED}\)")


def _ledger_refuses(setup: Setup, call: object, message: str) -> None:
    before = state_of(setup.runtime)
    with pytest.raises(KVIsolationError, match=message):
        call()  # type: ignore[operator]
    assert_same_state(setup.runtime, before)


def test_adopting_more_than_the_cache_holds_is_refused(setup: Setup) -> None:
    slots = cached_prefix(setup)
    r2t = setup.req_to_token
    third = np.array([slot_of(setup, 0, p) for p in range(CACHED, CACHED + PAGE)], dtype=np.int64)
    longer = np.concatenate([slots, third])
    _ledger_refuses(
        setup, lambda: r2t.adopt(2, longer), r"adopt: row 2 would read position 32 .* not a cached"
    )
    # the cached pages in another order: slot i must hold position i
    swapped = np.concatenate([slots[PAGE:], slots[:PAGE]])
    _ledger_refuses(setup, lambda: r2t.adopt(2, swapped), r"position 0 from slot .* holds position 16")
    _ledger_refuses(setup, lambda: r2t.adopt(2, slots[:5]), r"not a multiple of page_size 16")


def test_a_page_in_use_is_never_evicted(setup: Setup) -> None:
    slots = cached_prefix(setup)
    r2t, ledger = setup.req_to_token, setup.req_to_token.ledger
    _ledger_refuses(setup, lambda: r2t.unpin(slots[:PAGE]), r"slot \d+ is held by live row 1: a page in use")
    r2t.free(1)
    r2t.unpin(slots[:PAGE])
    assert (ledger.refs[slots[:PAGE]] == 0).all() and not ledger.pinned[slots[:PAGE]].any()
    _ledger_refuses(setup, lambda: r2t.unpin(slots[:PAGE]), r"is not pinned")


def test_only_live_kv_is_pinned(setup: Setup) -> None:
    prefill(setup, [0], [20], np.random.default_rng(3))
    r2t = setup.req_to_token
    free = np.array([slot_of(setup, 2, p) for p in range(PAGE)], dtype=np.int64)
    _ledger_refuses(setup, lambda: r2t.pin(free, np.arange(PAGE)), r"holds no live KV")
    held = np.array([slot_of(setup, 0, p) for p in range(PAGE)], dtype=np.int64)
    _ledger_refuses(setup, lambda: r2t.pin(held, np.arange(PAGE) + 1), r"holds position 0")
