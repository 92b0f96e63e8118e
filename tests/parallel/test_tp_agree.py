"""Ranks agree, always: each known divergence, forced on one rank, ends the same on every rank.

Every rank passes its *own* batch to ``TPRuntime.run``; rank 0's is broadcast and runs
everywhere, so a batch past the largest bucket, a bad batch or an uncaptured mode on one rank
cannot split the ranks. Without the broadcast, a rank that skips a collective leaves the
other waiting until the group's timeout, which raises naming the rank: never a hang.
"""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch

from graphrt import Batch, ForwardMode
from graphrt.parallel import init_tp, shutdown
from tests.support.tp_util import outcome, run_ranks
from tests.support.util import build_runtime, decode_batch, prefill, remade

CPU = torch.device("cpu")
LENS = [5, 9, 3, 12, 7, 4]


def _diverge(rank: int, world: int) -> dict:
    group = init_tp(world, CPU)
    setup = build_runtime(
        CPU,
        buckets=(1, 2, 4),
        max_batch_size=4,
        max_reqs=8,
        max_context_len=64,
        model="tiny-llama-draft",
        tp=group,
    )
    rt = setup.runtime
    prefill(setup, range(6), LENS, np.random.default_rng(0))
    rng = np.random.default_rng(1 + rank)  # NOTE: each rank builds different batches on purpose
    small = decode_batch(setup, [0, 1], [LENS[0] + 1, LENS[1] + 1], rng)
    big = decode_batch(setup, list(range(6)), [n + 1 for n in LENS], rng)
    bad = remade(small, input_ids=np.array([3, 10**6]))
    idle = Batch.create(ForwardMode.IDLE, input_ids=[], seq_lens=[], req_pool_indices=[], out_cache_loc=[])
    found = {}
    # bs past the largest bucket on rank 1 only: every rank replays rank 0's bucket
    found["past_bucket_on_one_rank"] = outcome(lambda: rt.run(small if rank == 0 else big).shape)
    # past the largest bucket on rank 0: every rank falls back, for the same reason
    found["past_bucket_on_rank0"] = outcome(lambda: rt.run(big if rank == 0 else small).shape)
    # a bad batch on rank 0: every rank raises the same error, and the group still works
    found["bad_batch_on_rank0"] = outcome(lambda: rt.run(bad if rank == 0 else small))
    # an uncaptured mode on rank 0 (IDLE: only DECODE is captured): every rank falls back
    found["uncaptured_mode_on_rank0"] = outcome(lambda: rt.run(idle if rank == 0 else small).shape)
    found["after"] = outcome(lambda: rt.run(small).shape)
    stats = rt.stats()
    found["stats"] = (stats.replays, stats.eager, stats.fallbacks)
    return found


def test_forced_divergences_end_the_same_on_every_rank() -> None:
    r0, r1 = run_ranks(_diverge, 2, timeout_s=20, deadline_s=300)
    assert r0 == r1, "ranks disagree"
    assert r0["past_bucket_on_one_rank"] == ("ok", repr(torch.Size([2, 512])))
    assert r0["past_bucket_on_rank0"] == ("ok", repr(torch.Size([6, 512])))
    assert r0["bad_batch_on_rank0"][0] == "ValueError" and "token id" in r0["bad_batch_on_rank0"][1]
    assert r0["after"][0] == "ok"
    replays, _, fallbacks = r0["stats"]
    assert fallbacks == {"DECODE": {"bs 6 > largest bucket 4": 1}, "IDLE": {"mode IDLE not captured": 1}}
    assert replays == {ForwardMode.DECODE.name: 2}


def _skip_collective(rank: int, world: int) -> tuple[str, str, float]:
    group = init_tp(world, CPU, timeout_s=3.0)
    setup = build_runtime(
        CPU, buckets=(1, 2), max_batch_size=2, max_context_len=64, model="tiny-llama-draft", tp=group
    )
    batch = decode_batch(setup, [0], [1], np.random.default_rng(0))
    start = time.monotonic()
    # NOTE: the inner runtime: no broadcast, so rank 1 never joins rank 0's all-reduce
    result = outcome(lambda: setup.runtime.inner.run(batch)) if rank == 0 else ("skipped", "")
    return (*result, time.monotonic() - start)


@pytest.mark.slow
def test_a_skipped_collective_times_out_naming_the_rank() -> None:
    (kind, message, seconds), _ = run_ranks(_skip_collective, 2, timeout_s=3.0, deadline_s=240)
    assert kind == "CollectiveError", message
    assert message.startswith("rank 0 of 2: all_reduce failed")
    assert seconds < 60


def _sampled_steps(rank: int, world: int) -> list[list[int]]:
    from graphrt import SamplingParams

    group = init_tp(world, CPU)
    setup = build_runtime(CPU, buckets=(2, 4), max_batch_size=4, max_context_len=64, sample=True, tp=group)
    prefill(setup, range(3), LENS[:3], np.random.default_rng(0))
    rng = np.random.default_rng(5)
    batch = decode_batch(setup, [0, 1, 2], [n + 1 for n in LENS[:3]], rng)
    # NOTE: only rank 0's parameters count; the other ranks pass other ones (or none)
    params = [SamplingParams(0.8, top_k=50, seed=3 + i) for i in range(3)] if rank == 0 else None
    tokens = [setup.runtime.run(remade(batch, sampling=params)).tolist()]
    tokens.append(setup.runtime.run(remade(batch, sampling=params), eager=True).tolist())
    return tokens


def test_a_sampled_step_returns_rank0s_tokens_on_every_rank() -> None:
    r0, r1 = run_ranks(_sampled_steps, 2, timeout_s=20, deadline_s=240)
    assert r0 == r1, "ranks sampled different tokens"
    assert r0[0] == r0[1], "graph and eager sampled different tokens"
    assert len(r0[0]) == 3 and all(isinstance(t, int) for t in r0[0])


STEPS = 40


def _two_threads(rank: int, world: int) -> dict[int, list[list[float]]]:
    import threading

    group = init_tp(world, CPU)
    setup = build_runtime(CPU, buckets=(1, 2), max_batch_size=2, max_context_len=96, tp=group)
    prefill(setup, [0, 1], [5, 9], np.random.default_rng(0))
    work = {
        row: [decode_batch(setup, [row], [start + i + 1], np.random.default_rng(row)) for i in range(STEPS)]
        for row, start in ((0, 5), (1, 9))
    }
    outputs: dict[int, list[list[float]]] = {0: [], 1: []}
    barrier = threading.Barrier(2)

    def caller(row: int) -> None:
        barrier.wait()
        for batch in work[row]:  # NOTE: rank 0's batches win; the other ranks' are ignored
            outputs[row].append(setup.runtime.run(batch)[0, :8].tolist())

    threads = [threading.Thread(target=caller, args=(row,)) for row in work]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if rank != 0:
        return {}
    shutdown()  # NOTE: rank 0's oracle: the whole model on one rank, the same steps in order
    ref = build_runtime(CPU, buckets=(1, 2), max_batch_size=2, max_context_len=96)
    prefill(ref, [0, 1], [5, 9], np.random.default_rng(0))
    want = {row: [ref.runtime.run(b)[0, :8].tolist() for b in batches] for row, batches in work.items()}
    return {row: [outputs[row], want[row]] for row in work}  # type: ignore[misc]


def test_two_threads_on_a_tp_runtime_get_tp1_outputs() -> None:
    found, _ = run_ranks(_two_threads, 2, timeout_s=30, deadline_s=300)
    for row, (got, want) in found.items():
        assert len(got) == len(want) == STEPS
        np.testing.assert_allclose(got, want, atol=1e-4, err_msg=f"row {row}")
