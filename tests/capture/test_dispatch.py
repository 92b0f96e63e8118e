"""Dispatcher: (mode, smallest bucket >= bs) to a graph, or a counted Fallback with its reason."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

import pytest

from graphrt.capture import BucketPolicy, Dispatcher, Fallback, GraphInfo


class Mode(enum.Enum):
    DECODE = "decode"
    TARGET_VERIFY = "target_verify"


@dataclass
class FakeGraph:
    info: GraphInfo
    replayed: int = field(default=0)

    def replay(self) -> None:
        self.replayed += 1


def fake(mode: Mode, bucket: int) -> FakeGraph:
    return FakeGraph(GraphInfo((mode, bucket), 0.0, 0, 1, ()))


def dispatcher_with(buckets: list[int], max_bs: int, mode: Mode = Mode.DECODE) -> Dispatcher:
    dispatcher = Dispatcher(BucketPolicy.create(max_bs, buckets))
    for bucket in dispatcher.policy.buckets:
        dispatcher.add(mode, bucket, fake(mode, bucket))
    return dispatcher


def test_select_returns_bucket_and_its_graph() -> None:
    dispatcher = dispatcher_with([1, 2, 4], 8)
    for bs, bucket in [(1, 1), (2, 2), (3, 4), (4, 4), (5, 8), (8, 8)]:
        chosen = dispatcher.select(Mode.DECODE, bs)
        assert not isinstance(chosen, Fallback)
        assert chosen[0] == bucket
        assert chosen[1] is dispatcher.graphs[(Mode.DECODE, bucket)]
        assert chosen[1].info.key == (Mode.DECODE, bucket)
    assert dispatcher.captured_modes() == {Mode.DECODE}


def test_select_too_large_falls_back_with_reason() -> None:
    dispatcher = dispatcher_with([1, 2, 4], 8)
    chosen = dispatcher.select(Mode.DECODE, 9)
    assert isinstance(chosen, Fallback)
    assert chosen.mode is Mode.DECODE
    assert "9" in chosen.reason
    assert "largest bucket 8" in chosen.reason
    assert chosen == Fallback(Mode.DECODE, "bs 9 > largest bucket 8")


def test_select_uncaptured_mode_falls_back() -> None:
    dispatcher = dispatcher_with([1, 2, 4], 8)
    chosen = dispatcher.select(Mode.TARGET_VERIFY, 3)
    assert isinstance(chosen, Fallback)
    assert chosen.mode is Mode.TARGET_VERIFY
    assert "not captured" in chosen.reason
    assert "TARGET_VERIFY" in chosen.reason
    # a plain hashable mode is named by str()
    assert dispatcher.select("prefill", 1) == Fallback("prefill", "mode prefill not captured")


def test_select_missing_bucket_of_a_captured_mode_falls_back() -> None:
    dispatcher = Dispatcher(BucketPolicy.create(8, [2, 4]))
    dispatcher.add(Mode.DECODE, 8, fake(Mode.DECODE, 8))
    assert isinstance(dispatcher.select(Mode.DECODE, 3), Fallback)
    assert dispatcher.select(Mode.DECODE, 5)[0] == 8


def test_counters() -> None:
    dispatcher = dispatcher_with([1, 2, 4], 8)
    too_big = dispatcher.select(Mode.DECODE, 100)
    missing = dispatcher.select(Mode.TARGET_VERIFY, 1)
    assert isinstance(too_big, Fallback) and isinstance(missing, Fallback)
    for _ in range(3):
        dispatcher.count_fallback(too_big)
    dispatcher.count_fallback(missing)
    # an equal Fallback (same mode, same reason) counts under the same key
    dispatcher.count_fallback(dispatcher.select(Mode.DECODE, 100))
    for _ in range(5):
        dispatcher.count_replay(Mode.DECODE)
    assert dispatcher.fallbacks == {too_big: 4, missing: 1}
    assert dispatcher.replays == {Mode.DECODE: 5}
    assert dispatcher.replays[Mode.TARGET_VERIFY] == 0


def test_add_rejects_bucket_outside_policy() -> None:
    dispatcher = Dispatcher(BucketPolicy.create(8, [2, 4]))
    for bucket in (1, 3, 9):
        with pytest.raises(ValueError, match=f"bucket {bucket}"):
            dispatcher.add(Mode.DECODE, bucket, fake(Mode.DECODE, bucket))
    assert dispatcher.graphs == {}
    dispatcher.add(Mode.DECODE, 4, fake(Mode.DECODE, 4))
    assert set(dispatcher.graphs) == {(Mode.DECODE, 4)}
