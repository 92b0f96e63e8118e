"""Lazy capture under TP (two CPU ranks, gloo): every rank captures the same key in the same step.

Each rank runs rank 0's batches (``TPRuntime``); a key is captured on its first step on both
ranks, and whether both captures succeeded is agreed on before either replays it. A capture
that fails on one rank only (after its collectives ran: instantiation, pool growth) sends both
down the eager path for that key: no rank waits in a collective the other skipped
(``run_ranks`` fails the test on a hang).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.support.tp_util import run_ranks

STEPS = ([0], [0, 1, 2], [1], [0, 1, 2, 3], [2])  # NOTE: buckets 1, 4, 1, 4, 1


def lazy_steps(rank: int, world: int, fail_on: int | None) -> dict:
    """The steps' outputs (graph path, lazily captured) against eager runs, and the counters."""
    from graphrt import ForwardMode
    from graphrt.parallel import init_tp
    from tests.support.util import build_runtime, decode_batch, next_lens, prefill

    group = init_tp(world, torch.device("cpu"))
    s = build_runtime(torch.device("cpu"), max_batch_size=4, buckets=(1, 4), tp=group, lazy=True)
    if rank == fail_on:
        capture = s.runtime.capturer.engine.capture

        def failing(key, fn, warmup):  # type: ignore[no-untyped-def]
            made = capture(key, fn, warmup)  # NOTE: the warm-up and recording ran their collectives
            if key == (ForwardMode.DECODE, 4):  # NOTE: as an instantiation or pool growth fails
                raise RuntimeError(f"out of memory on rank {rank} (injected)")
            return made

        s.runtime.capturer.engine.capture = failing
    prefill(s, [0, 1, 2, 3], [4, 5, 6, 7], np.random.default_rng(0))
    diffs = []
    for seed, reqs in enumerate(STEPS):
        batch = decode_batch(s, reqs, next_lens(s, reqs), np.random.default_rng(seed))
        graph, eager = s.runtime.run(batch), s.runtime.run(batch, eager=True)
        diffs.append(float((graph - eager).abs().max()))
    stats = s.runtime.stats()
    return {
        "diffs": diffs,
        "captures": stats.captures,
        "replays": stats.replays,
        "fallbacks": stats.fallbacks,
    }


@pytest.mark.parametrize("fail_on", [None, 1], ids=["both-capture", "rank1-fails"])
def test_lazy_capture_is_collective(fail_on: int | None) -> None:
    results = run_ranks(lazy_steps, 2, fail_on, deadline_s=300)
    for rank, found in enumerate(results):
        assert max(found["diffs"]) < 1e-4, f"rank {rank}: graph and eager differ: {found['diffs']}"
    if fail_on is None:
        for found in results:
            assert found["captures"] == {"DECODE": {1: 1, 4: 1}} and found["replays"] == {"DECODE": 5}
            assert found["fallbacks"] == {}
        return
    why = {0: "another rank's capture failed", 1: "RuntimeError: out of memory on rank 1 (injected)"}
    for rank, found in enumerate(results):
        # NOTE: rank 0 captured bucket 4 too, yet both ranks dropped it and ran those steps eagerly
        assert found["captures"] == {"DECODE": {1: 1}} and found["replays"] == {"DECODE": 3}
        assert found["fallbacks"] == {"DECODE": {f"capture of DECODE bs=4 failed: {why[rank]}": 2}}
