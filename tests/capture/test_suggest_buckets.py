"""Buckets from the workload: the DP is the brute-force optimum, ladders are checked exactly."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from graphrt.capture import BucketPolicy, Dispatcher, optimal_buckets, padded_tokens
from graphrt.runtime.telemetry import Telemetry, step_weights
from graphrt.step import ForwardMode


def brute_force(weights: dict[int, int], max_graphs: int, largest: int) -> tuple[int, ...]:
    """Every ladder of sizes 1..largest that holds ``largest``, ranked as the DP ranks ties."""
    below = range(1, largest)
    ladders = [(*rest, largest) for k in range(max_graphs) for rest in itertools.combinations(below, k)]
    return min(ladders, key=lambda lad: (padded_tokens(weights, lad), len(lad), lad[::-1]))


@pytest.mark.parametrize("seed", range(40))
def test_dp_matches_brute_force(seed: int) -> None:
    rng = np.random.default_rng(seed)
    largest = int(rng.integers(1, 11))
    sizes = rng.choice(np.arange(1, largest + 1), size=int(rng.integers(1, largest + 1)), replace=False)
    weights = {int(bs): int(rng.integers(1, 6)) for bs in sizes}
    for max_graphs in range(1, 6):
        got = optimal_buckets(weights, max_graphs, largest)
        assert got == brute_force(weights, max_graphs, largest), (weights, max_graphs)
        assert got[-1] == largest and len(got) <= max_graphs


def test_default_largest_is_the_largest_observed() -> None:
    assert optimal_buckets({3: 1, 9: 1, 5: 2}, 1) == (9,)
    assert optimal_buckets({3: 1, 9: 1, 5: 2}, 3) == (3, 5, 9)


def test_enough_graphs_pad_nothing() -> None:
    weights = {1: 7, 4: 2, 13: 1, 30: 5}
    assert optimal_buckets(weights, 10, 64) == (1, 4, 13, 30, 64)
    assert padded_tokens(weights, optimal_buckets(weights, 10, 64)) == 0
    assert optimal_buckets(weights, 4, 30) == (1, 4, 13, 30)  # NOTE: 4 graphs, not 5: max is observed


def test_ties_go_to_fewest_graphs_then_smallest_lower_buckets() -> None:
    # {1, 3} and {2, 3} both pad one row; the smaller second-largest bucket wins
    assert optimal_buckets({1: 1, 2: 1, 3: 1}, 2) == (1, 3)
    # a weight of 0 is no observation: 5 needs no bucket of its own
    assert optimal_buckets({2: 4, 5: 0}, 3, 8) == (2, 8)


def test_weights_decide() -> None:
    # 100 steps at bs 3 against 1 at bs 5 (cap 8, 2 graphs): bucket 3 pads 5 rows, bucket 5 pads 200
    assert optimal_buckets({3: 100, 5: 1}, 2, 8) == (3, 8)
    assert optimal_buckets({3: 1, 5: 100}, 2, 8) == (5, 8)


def test_large_histogram_is_fast_and_beats_the_default_ladder() -> None:
    rng = np.random.default_rng(0)
    sizes, counts = np.unique(rng.zipf(1.3, 50_000).clip(1, 512), return_counts=True)
    weights = {int(b): int(c) for b, c in zip(sizes, counts, strict=True)}
    default = BucketPolicy.create(512).buckets
    best = optimal_buckets(weights, len(default), 512)
    assert len(best) <= len(default) and best[-1] == 512
    assert padded_tokens(weights, best) < padded_tokens(weights, default)


@pytest.mark.parametrize(
    ("weights", "max_graphs", "largest", "match"),
    [
        ({3: 1}, 0, None, "max_graphs must be >= 1, got 0"),
        ({3: 1}, -2, None, "max_graphs must be >= 1, got -2"),
        ({}, 2, None, "no batch sizes observed"),
        ({3: 0}, 2, None, "no batch sizes observed"),
        ({0: 1}, 2, None, r"batch sizes must be >= 1.*\(0, 1\)"),
        ({3: -1}, 2, None, r"weights >= 0.*\(3, -1\)"),
        ({3: 1, 9: 1}, 2, 8, "largest bucket 8 is below the largest observed batch size 9"),
    ],
)
def test_dp_refuses(weights: dict[int, int], max_graphs: int, largest: int | None, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        optimal_buckets(weights, max_graphs, largest)


def test_padded_tokens_skips_sizes_past_the_ladder() -> None:
    assert padded_tokens({1: 2, 3: 1, 9: 5}, (2, 4)) == 2 * 1 + 1 * 1


@pytest.mark.parametrize(
    ("buckets", "match"),
    [
        ([], r"at least one batch size, got \[\]"),
        ([0, 4], r"bucket 0 is outside 1\.\.8"),
        ([2, 16], r"bucket 16 is outside 1\.\.8.*max_batch_size"),
        ([4, 2], r"sorted and unique: 2 follows 4"),
        ([2, 2, 8], r"sorted and unique: 2 follows 2"),
        ([2.5, 8], r"bucket 2\.5 is not an integer"),
        ([True, 8], r"bucket True is not an integer"),
    ],
)
def test_exact_ladder_refuses(buckets: list, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        BucketPolicy.exact(buckets, 8)


def test_exact_ladder_keeps_what_it_is_given() -> None:
    assert BucketPolicy.exact([3, 5], 8).buckets == (3, 5)  # NOTE: no max added
    assert BucketPolicy.exact(np.array([1, 8]), 8).buckets == (1, 8)


def test_dispatcher_replace_drops_graphs_keeps_counters() -> None:
    d = Dispatcher(BucketPolicy.create(8))
    d.graphs[("DECODE", 8)] = object()  # type: ignore[assignment]
    d.count_replay("DECODE")
    d.replace(BucketPolicy.exact([3, 8], 8))
    assert d.graphs == {} and d.policy.buckets == (3, 8) and d.replays["DECODE"] == 1


def test_histogram_survives_the_ring() -> None:
    t = Telemetry(capacity=2)
    for bs in (1, 3, 3, 5, 3):
        t.replayed("DECODE", bs, 8, 0.0, 0.0, torch.device("cpu"))
    t.fell_back("DECODE", 12, "bs 12 > largest bucket 8")
    assert len(t.records) == 2
    assert t.histogram("DECODE") == {1: 1, 3: 3, 5: 1, 12: 1}
    assert t.histogram("TARGET_VERIFY") == {}


def test_step_weights_count_rows_per_request() -> None:
    counts = {("DECODE", 2): 5, ("TARGET_VERIFY", 2): 3, ("IDLE", 0): 4, ("DECODE", 9): 7, ("EXTEND", 2): 1}
    rows = {ForwardMode.DECODE: 1, ForwardMode.TARGET_VERIFY: 4, ForwardMode.IDLE: 1}
    got = step_weights(counts, rows, rows.__getitem__, largest=8)
    # TARGET_VERIFY pads 4 rows per request; IDLE (0 requests) pads like 1; 9 > 8 and EXTEND left out
    assert got == {2: 5 + 3 * 4, 1: 4}
