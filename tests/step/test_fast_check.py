"""The fast check of ``Batch.check`` agrees with the full one: same verdict, same message."""

from __future__ import annotations

import numpy as np
import pytest

from graphrt import Batch, ForwardMode
from graphrt.step import Limits, SpecGeometry
from graphrt.step.checks import distinct, distinct_below, distinct_rows, fast_ok

SPEC = SpecGeometry(num_steps=3, topk=1)


def _limits(ps: int) -> Limits:
    return Limits(16, 256, ps, 64 * 16, vocab_size=100, speculative=SPEC)


def _verdict(fn) -> str:
    try:
        fn()
    except ValueError as err:
        return str(err)
    return "ok"


def _batch(rng: np.random.Generator, mode: ForwardMode, ps: int) -> Batch:
    """A valid batch of ``mode``, then (often) one field broken at random."""
    bs = int(rng.integers(1, 9))
    q = {ForwardMode.DECODE: 1, ForwardMode.TARGET_VERIFY: 4, ForwardMode.DRAFT_DECODE: 1}.get(mode)
    q_lens = rng.integers(1, 5, bs) if q is None else np.full(bs, q)
    steps = SPEC.draft_forwards if mode is ForwardMode.DRAFT_DECODE else 1
    reqs = rng.permutation(16)[:bs]
    seq = rng.integers(8, 200, bs)
    if mode is ForwardMode.DRAFT_DECODE:
        pos = [s - 1 + i for s in seq for i in range(steps)]
        owner = np.repeat(reqs, steps)
    else:
        pos = [p for s, n in zip(seq, q_lens, strict=True) for p in range(s - n, s)]
        owner = np.repeat(reqs, q_lens)
    loc = owner * 64 + np.asarray(pos, dtype=np.int64)  # 64 slots per request row, aligned
    ids = rng.integers(0, 100, int(q_lens.sum()))
    fields = {"input_ids": ids, "seq_lens": seq, "req_pool_indices": reqs, "out_cache_loc": loc}
    which = rng.integers(0, 9)
    arr = {1: reqs, 2: loc, 3: ids, 4: seq, 5: loc}.get(int(which))
    if arr is not None:
        i = int(rng.integers(0, arr.size))
        j = int(rng.integers(0, arr.size))
        arr[i] = [0, arr[j], 100 + int(rng.integers(0, 2)) * -101, 300, arr[i] + 1][int(which) - 1]
        if which == 2 and rng.integers(0, 2):
            arr[i] = -3
    if which == 6:
        seq[0] = int(q_lens[0]) - 1
    return Batch.create(mode, q_lens=q_lens, **fields)


@pytest.mark.parametrize("ps", [1, 16, 3])
@pytest.mark.parametrize(
    "mode",
    [ForwardMode.DECODE, ForwardMode.TARGET_VERIFY, ForwardMode.DRAFT_DECODE, ForwardMode.DRAFT_EXTEND],
)
def test_fast_check_agrees_with_full(mode: ForwardMode, ps: int) -> None:
    rng = np.random.default_rng(ps * 7 + len(mode.value))
    limits = _limits(ps)
    seen = set()
    for _ in range(300):
        batch = _batch(rng, mode, ps)
        full = _verdict(lambda b=batch: (b._check_geometry(limits), b._check_full(limits)))
        assert _verdict(lambda b=batch: b.check(limits)) == full
        if fast_ok(batch, limits, limits.scratch):
            assert full == "ok"  # the fast path only ever accepts valid batches
        seen.add(full.split(":")[0][:30])
    assert "ok" in seen and len(seen) >= 4  # the random breaks hit several distinct checks


def test_distinct_helpers() -> None:
    limits = _limits(16)
    assert distinct(np.array([3, 1, 2])) and not distinct(np.array([3, 1, 3]))
    assert distinct_rows(np.array([3, 1, 2]), limits.scratch)
    assert not distinct_rows(np.array([5, 1, 5]), limits.scratch)
    assert distinct_rows(np.array([5, 1, 2]), limits.scratch)  # stale stamps never matter


def test_create_keeps_int64_arrays() -> None:
    seq = np.array([5, 6], dtype=np.int64)
    batch = Batch.create(
        ForwardMode.DECODE, input_ids=[1, 2], seq_lens=seq, req_pool_indices=[0, 1], out_cache_loc=[4, 5]
    )
    assert batch.seq_lens is seq and batch.q_lens.tolist() == [1, 1]
    with pytest.raises(ValueError, match="out_cache_loc has 1 entries, input_ids 2"):
        Batch.create(
            ForwardMode.DECODE, input_ids=[1, 2], seq_lens=seq, req_pool_indices=[0, 1], out_cache_loc=[4]
        )


def test_distinct_below() -> None:
    assert distinct_below(np.array([3, 1, 2]), 4) and distinct_below(np.zeros(0, np.int64), 1)
    assert not distinct_below(np.array([3, 1, 3]), 4)  # repeat
    assert not distinct_below(np.array([3, 1, 4]), 4) and not distinct_below(np.array([-1, 2]), 4)
    assert distinct_below(np.array([0]), 1) and not distinct_below(np.array([1]), 1)
