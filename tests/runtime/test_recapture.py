"""suggest_buckets from the steps run, recapture swaps the ladder whole; replays stay eager-exact."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import torch

from graphrt.capture import optimal_buckets
from tests.runtime.test_decode_parity import tolerance
from tests.support.util import Setup, build_runtime, decode_batch, next_lens, prefill

ROWS = list(range(6))


def _setup(device: torch.device) -> Setup:
    s = build_runtime(device, max_batch_size=8, max_context_len=128, max_reqs=8)
    prefill(s, ROWS, [5 + r for r in ROWS], np.random.default_rng(0))
    return s


def _decode(s: Setup, rows: list[int], seed: int) -> torch.Tensor:
    return s.runtime.run(decode_batch(s, rows, next_lens(s, rows), np.random.default_rng(seed)))


def test_suggest_from_observed_steps(device: torch.device) -> None:
    s = _setup(device)
    for i in range(6):
        _decode(s, ROWS[:3], i)  # bs 3, six times
    _decode(s, ROWS[:5], 9)  # bs 5 once
    assert s.runtime.telemetry.histogram("DECODE") == {3: 6, 5: 1}
    # 2 graphs: 3 and the allocation (8); 3 graphs: 3, 5, 8
    assert s.runtime.suggest_buckets(2) == (3, 8)
    assert s.runtime.suggest_buckets(3) == (3, 5, 8)
    assert s.runtime.suggest_buckets(1) == (8,)
    assert s.runtime.suggest_buckets(2, largest=5) == (3, 5)
    assert s.runtime.suggest_buckets(2) == optimal_buckets({3: 6, 5: 1}, 2, 8)


def test_suggest_refuses(device: torch.device) -> None:
    s = build_runtime(device, max_batch_size=8)
    with pytest.raises(ValueError, match="no graphed steps of at most 8 requests observed yet"):
        s.runtime.suggest_buckets(2)
    with pytest.raises(ValueError, match="max_graphs must be >= 1, got 0"):
        s.runtime.suggest_buckets(0)  # NOTE: the argument is checked before the histogram
    prefill(s, [0], [4], np.random.default_rng(0))
    _decode(s, [0], 1)
    with pytest.raises(ValueError, match="max_graphs must be >= 1, got 0"):
        s.runtime.suggest_buckets(0)
    with pytest.raises(ValueError, match=r"largest bucket 9 is outside 1\.\.8"):
        s.runtime.suggest_buckets(2, largest=9)


def test_recapture_then_replays_equal_eager(device: torch.device) -> None:
    s, oracle = _setup(device), _setup(device)
    report = s.runtime.recapture((3, 5, 8))
    assert s.runtime.dispatcher.policy.buckets == (3, 5, 8)
    assert sorted(k for _, k in s.runtime.dispatcher.graphs) == [3, 5, 8]
    assert len(report.graphs) == 3
    for seed, rows in enumerate([ROWS[:1], ROWS[:3], ROWS[:4], ROWS[:6], ROWS[:2]]):
        batch = decode_batch(s, rows, next_lens(s, rows), np.random.default_rng(seed))
        got = s.runtime.run(batch)
        assert s.runtime.telemetry.last_replay().bucket == {1: 3, 2: 3, 3: 3, 4: 5, 6: 8}[len(rows)]
        expected = oracle.runtime.run(batch, eager=True)
        torch.testing.assert_close(got, expected, **tolerance(device), msg=f"bs {len(rows)}")
    assert s.runtime.stats().replays == {"DECODE": 5}


def test_ladder_below_the_allocation_falls_back_above_it(device: torch.device) -> None:
    s, oracle = _setup(device), _setup(device)
    s.runtime.recapture([2, 4])
    batch = decode_batch(s, ROWS[:6], next_lens(s, ROWS[:6]), np.random.default_rng(3))
    torch.testing.assert_close(
        s.runtime.run(batch), oracle.runtime.run(batch, eager=True), **tolerance(device)
    )
    assert s.runtime.stats().fallbacks == {"DECODE": {"bs 6 > largest bucket 4": 1}}


@pytest.mark.parametrize(
    ("buckets", "match"),
    [
        ([2, 16], r"bucket 16 is outside 1\.\.8"),
        ([4, 2], "sorted and unique: 2 follows 4"),
        ([], "at least one batch size"),
        ([0], r"bucket 0 is outside 1\.\.8"),
    ],
)
def test_bad_ladder_refused_before_anything_is_dropped(
    device: torch.device, buckets: list[int], match: str
) -> None:
    s = build_runtime(device, max_batch_size=8)
    before = dict(s.runtime.dispatcher.graphs)
    with pytest.raises(ValueError, match=match):
        s.runtime.recapture(buckets)
    assert s.runtime.dispatcher.graphs == before
    assert s.runtime.dispatcher.policy.buckets == (1, 2, 4, 8)


def test_failed_capture_leaves_no_graphs_and_steps_run_eagerly(
    device: torch.device, monkeypatch: pytest.MonkeyPatch
) -> None:
    s, oracle = _setup(device), _setup(device)
    real = s.runtime.engine.capture
    calls = []

    def failing(key, fn, warmup):  # type: ignore[no-untyped-def]
        calls.append(key)
        if len(calls) == 2:
            raise RuntimeError("out of memory (injected)")
        return real(key, fn, warmup)

    monkeypatch.setattr(s.runtime.engine, "capture", failing)
    with pytest.raises(RuntimeError, match="injected"):
        s.runtime.recapture([3, 8])
    assert s.runtime.dispatcher.graphs == {}
    batch = decode_batch(s, ROWS[:3], next_lens(s, ROWS[:3]), np.random.default_rng(4))
    torch.testing.assert_close(
        s.runtime.run(batch), oracle.runtime.run(batch, eager=True), **tolerance(device)
    )
    assert s.runtime.stats().fallbacks == {"DECODE": {"mode DECODE not captured": 1}}
    monkeypatch.setattr(s.runtime.engine, "capture", real)
    s.runtime.recapture([3, 8])
    assert s.runtime.stats().replays == {}
    s.runtime.run(decode_batch(s, ROWS[:3], next_lens(s, ROWS[:3]), np.random.default_rng(5)))
    assert s.runtime.stats().replays == {"DECODE": 1}


def test_run_during_recapture_waits_and_is_correct(
    device: torch.device, monkeypatch: pytest.MonkeyPatch
) -> None:
    s, oracle = _setup(device), _setup(device)
    real = s.runtime.engine.capture
    capturing, proceed = threading.Event(), threading.Event()
    order: list[str] = []

    def slow(key, fn, warmup):  # type: ignore[no-untyped-def]
        if not capturing.is_set():
            capturing.set()
            assert proceed.wait(30), "the test never let capture go on"
        return real(key, fn, warmup)

    monkeypatch.setattr(s.runtime.engine, "capture", slow)
    batch = decode_batch(s, ROWS[:3], next_lens(s, ROWS[:3]), np.random.default_rng(7))
    results: dict[str, object] = {}

    def recapture() -> None:
        results["report"] = s.runtime.recapture([3, 8])
        order.append("recaptured")

    def step() -> None:
        try:
            results["out"] = s.runtime.run(batch)
        except BaseException as exc:  # NOTE: a thread's exception would otherwise be lost
            results["out"] = exc
        order.append("ran")

    rt_thread, run_thread = threading.Thread(target=recapture), threading.Thread(target=step)
    rt_thread.start()
    assert capturing.wait(30)
    run_thread.start()
    time.sleep(0.2)
    assert run_thread.is_alive(), "run() did not wait for the recapture in flight"
    assert s.runtime.dispatcher.graphs == {}  # NOTE: half-built: what run() must never see
    proceed.set()
    rt_thread.join(60)
    run_thread.join(60)
    assert order == ["recaptured", "ran"]
    assert isinstance(results["out"], torch.Tensor)
    torch.testing.assert_close(results["out"], oracle.runtime.run(batch, eager=True), **tolerance(device))
    assert s.runtime.telemetry.last_replay().bucket == 3
    assert s.runtime.stats().fallbacks == {}
