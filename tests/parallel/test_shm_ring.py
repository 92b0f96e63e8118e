"""The step ring: rank 0's steps reach every rank in order through ``/dev/shm`` (long ones over
gloo), the ring wraps around, ``GRAPHRT_STEP_CHANNEL=gloo`` turns it off, and a step that never
comes raises naming the rank after the group's timeout."""

from __future__ import annotations

import os
import time

import numpy as np
import pytest
import torch

from graphrt import Batch, ForwardMode
from graphrt.kernels import switches
from graphrt.parallel import Message, Op, StepChannel, init_tp, pack
from graphrt.parallel.shm_ring import SHM_DIR, SLOT_WORDS, SLOTS, ring_for
from tests.support.tp_util import run_ranks

pytestmark = pytest.mark.skipif(not SHM_DIR.is_dir(), reason="no /dev/shm")
CPU = torch.device("cpu")


def messages() -> list[Message]:
    """More messages than slots; one decode step too long for a slot (it goes over gloo)."""
    rng = np.random.default_rng(0)
    out = []
    for i, bs in enumerate([1, 3, 64, SLOT_WORDS // 4 + 1, 2, 7, 1, 16, 5]):
        ids = rng.integers(0, 1000, bs)
        batch = Batch.create(
            ForwardMode.DECODE,
            input_ids=ids,
            seq_lens=rng.integers(1, 500, bs),
            req_pool_indices=np.arange(bs),
            out_cache_loc=rng.integers(0, 10**6, bs),
        )
        out.append(Message(Op.RUN, target=i % 2, eager=bool(i % 3 == 0), batch=batch))
    out.append(Message(Op.STOP))
    return out


def _exchange(rank: int, world: int, channel_env: str) -> tuple[bool, list[list[int]]]:
    os.environ["GRAPHRT_STEP_CHANNEL"] = channel_env
    switches.forget()  # NOTE: a forked rank inherits the parent's switch record: read this one
    group = init_tp(world, CPU)
    channel = StepChannel(group)
    got = [channel.exchange(m if rank == 0 else None) for m in messages()]
    return ring_for(group) is not None, [pack(m).tolist() for m in got]


@pytest.mark.parametrize("channel_env", ["shm", "gloo"])
def test_every_rank_gets_rank0s_steps_in_order(channel_env: str) -> None:
    want = [pack(m).tolist() for m in messages()]
    assert len(want) > SLOTS and max(len(w) for w in want) > SLOT_WORDS
    results = run_ranks(_exchange, 3, channel_env, timeout_s=30, deadline_s=240)
    for rank, (ringed, got) in enumerate(results):
        assert ringed == (channel_env == "shm"), f"rank {rank}: ring {'missing' if ringed else 'present'}"
        assert got == want, f"rank {rank}: a step differs from rank 0's"
    assert not list(SHM_DIR.glob("graphrt-*")), "a ring file was left in /dev/shm"


def _missing_step(rank: int, world: int) -> tuple[str, str, float]:
    group = init_tp(world, CPU, timeout_s=2.0)
    channel = StepChannel(group)
    start = time.monotonic()
    try:
        if rank == 1:
            channel.exchange(None)  # NOTE: rank 0 never sends
    except Exception as err:
        return type(err).__name__, str(err), time.monotonic() - start
    return "none", "", 0.0


def test_a_step_that_never_comes_times_out_naming_the_rank() -> None:
    _, (kind, message, seconds) = run_ranks(_missing_step, 2, timeout_s=30, deadline_s=120)
    assert kind == "CollectiveError", message
    assert message.startswith("rank 1 of 2: waited 2 s for step 1 from rank 0"), message
    assert 2.0 <= seconds < 30


def _channel_bench(rank: int, world: int) -> dict[str, float]:
    from graphrt.tools.bench.tp import channel_us

    group = init_tp(world, CPU)
    return channel_us(group, messages()[2].batch, iters=20)  # type: ignore[arg-type]


def test_bench_tp_times_both_channels_on_the_same_step() -> None:
    results = run_ranks(_channel_bench, 2, timeout_s=30, deadline_s=120)
    assert results[0] == results[1], "every rank reports the last rank's numbers"
    assert set(results[0]) == {"ring", "gloo"} and all(us > 0 for us in results[0].values())
