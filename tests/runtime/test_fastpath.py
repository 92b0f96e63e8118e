"""The hot path's precomputed state (routes, plans, cached helpers) never goes stale."""

from __future__ import annotations

import numpy as np
import torch

from graphrt import ForwardMode
from graphrt.kv.ledger import KVLedger, KVWrites
from graphrt.runtime.telemetry import StepRecord, Telemetry
from graphrt.step.hostops import any_true, umax, umin
from graphrt.step.modes import MODES
from tests.runtime.test_decode_parity import tolerance
from tests.support.util import Setup, build_runtime, decode_batch, next_lens, prefill

ROWS = list(range(6))


def _setup(device: torch.device) -> Setup:
    s = build_runtime(device, max_batch_size=8, max_context_len=128, max_reqs=8)
    prefill(s, ROWS, [5 + r for r in ROWS], np.random.default_rng(0))
    return s


def _step(s: Setup, oracle: Setup, rows: list[int], seed: int) -> torch.Tensor:
    batch = decode_batch(s, rows, next_lens(s, rows), np.random.default_rng(seed))
    got = s.runtime.run(batch)
    torch.testing.assert_close(got, oracle.runtime.run(batch, eager=True), **tolerance(s.runtime.device))
    return got


def test_routes_follow_recapture_and_release(device: torch.device) -> None:
    s, oracle = _setup(device), _setup(device)
    _step(s, oracle, ROWS[:3], 0)
    first = s.runtime.telemetry.last_replay().bucket
    assert s.runtime.capturer.routes.by_mode[ForwardMode.DECODE][3].bucket == first
    s.runtime.recapture((3, 8))  # NOTE: bs 3 had a route to another graph (and bucket)
    assert s.runtime.capturer.routes.by_mode == {}
    _step(s, oracle, ROWS[:3], 1)
    assert s.runtime.telemetry.last_replay().bucket == 3
    route = s.runtime.capturer.routes.by_mode[ForwardMode.DECODE][3]
    assert route.graph is s.runtime.dispatcher.graphs[(ForwardMode.DECODE, 3)]
    assert route.output is s.runtime.capturer.outputs[(ForwardMode.DECODE, 3)]
    s.runtime.release()
    assert s.runtime.capturer.routes.by_mode == {}
    _step(s, oracle, ROWS[:3], 2)  # no graph left: eager, counted, never a stale route
    assert s.runtime.stats().eager["DECODE"] == 1


def test_result_is_fresh_and_cached_view_is_the_graph_output(device: torch.device) -> None:
    s, oracle = _setup(device), _setup(device)
    out = _step(s, oracle, ROWS[:2], 0)
    route = s.runtime.capturer.routes.by_mode[ForwardMode.DECODE][2]
    view = route.result(False, 2)
    assert view.data_ptr() == route.output.data_ptr() and view.shape[0] == 2
    assert out.data_ptr() != view.data_ptr()  # the caller's tensor is a copy
    kept = out.clone()
    _step(s, oracle, ROWS[:2], 1)
    torch.testing.assert_close(out, kept, rtol=0, atol=0)  # a later step never changes it
    assert route.result(False, 2) is view  # sliced once
    assert route.result(False, 1).shape[0] == 1  # an unexpected token count slices afresh


def test_numpy_helpers_match_numpy() -> None:
    rng = np.random.default_rng(0)
    for n in (1, 2, 7, 300):
        a = rng.integers(-50, 50, n)
        assert umax(a) == int(a.max()) and umin(a) == int(a.min())
        mask = a > 40
        assert any_true(mask) == bool(mask.any())
    assert not any_true(np.zeros(0, dtype=bool))


def test_mode_hash_is_identity_and_lookups_work() -> None:
    assert all(hash(m) == object.__hash__(m) for m in ForwardMode)
    assert set(MODES) == set(ForwardMode) and {m: m.name for m in ForwardMode}[ForwardMode.IDLE] == "IDLE"


def test_per_row_commit_equals_the_general_path() -> None:
    """DECODE's per-row KVWrites and the same writes spelt out generally leave one ledger state."""
    a, b = KVLedger(4, 64, 256), KVLedger(4, 64, 256)
    rows, starts = np.array([2, 0, 3]), np.array([0, 0, 0])
    slots = np.array([10, 20, 30])
    fast = KVWrites(rows, starts, np.ones(3, np.int64), slots, np.arange(3), starts, True, True)
    slow = KVWrites(rows, starts, np.ones(3, np.int64), slots, np.arange(3), starts)
    a.commit(fast)
    b.commit(slow)
    for name in ("valid_lens", "table", "owner", "refs", "slot_pos"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name), err_msg=name)


def test_telemetry_ring_reads_as_records() -> None:
    t = Telemetry(capacity=2)
    t.replayed("DECODE", 3, 4, 1.0, 1.5, torch.device("cpu"))
    t.fell_back("DECODE", 9, "too big")
    t.replayed("DECODE", 1, 1, 2.0, 2.25, torch.device("cpu"))
    records = t.records
    assert all(isinstance(r, StepRecord) for r in records) and len(records) == 2
    assert records[0].fallback == "too big" and records[1].update_us == 0.25e6
    assert t.last_replay() == records[1] and t.steps["DECODE"] == 3


def test_rewriting_a_tail_equals_truncate_then_commit() -> None:
    """A step rewriting its own tail (same slots; other slots; some rows only growing) leaves
    the state that truncating first and committing afresh leaves (the ledger's shortcuts)."""
    rows, starts = np.array([2, 0, 3]), np.array([4, 4, 4])
    first = KVWrites(
        rows, starts, np.ones(3, np.int64), np.array([10, 20, 30]), np.arange(3), starts, True, True
    )
    again = [
        first,
        first._replace(slots=np.array([11, 20, 31])),
        first._replace(
            starts=np.array([4, 5, 4]), slots=np.array([10, 21, 30]), slot_pos=np.array([4, 5, 4])
        ),
    ]
    for w in again:
        a, b = KVLedger(4, 64, 256), KVLedger(4, 64, 256)
        for ledger in (a, b):
            ledger.valid_lens[rows] = 4
            ledger.commit(first)
        a.check(w)
        a.commit(w)
        b.truncate(w.rows, w.starts)
        b.commit(w)
        for name in ("valid_lens", "table", "owner", "refs", "slot_pos"):
            np.testing.assert_array_equal(getattr(a, name), getattr(b, name), err_msg=name)
