"""The token feed with TP on CPU ranks (gloo): every rank's DECODE graph gathers and records in its
own feed; rank 1 passes no feed (a follower: its runtime's own), rank 0 its runtime's. Fed tokens
equal the host-fed ones on every rank, and each rank's feed holds the same tokens."""

from __future__ import annotations

import torch

from graphrt.parallel import init_tp
from tests.runtime.test_feed import setup, trajectory
from tests.support.tp_util import run_ranks


def fed_and_host_fed(rank: int, world: int) -> tuple[list[list[int]], list[list[int]], list[int]]:
    s = setup(tp=init_tp(world, torch.device("cpu")))
    host = trajectory(s, fed=False)
    fed = trajectory(s, fed=True, give_feed=rank == 0)  # NOTE: asserts the rank's feed holds them
    return host, fed, s.runtime.tokens.last.tolist()[:-1]


def test_fed_decode_tp2_equals_host_fed_on_every_rank() -> None:
    results = run_ranks(fed_and_host_fed, 2, deadline_s=120)
    for rank, (host, fed, _) in enumerate(results):
        assert fed == host, f"rank {rank}: fed tokens differ from host-fed"
    assert results[0] == results[1], "ranks' tokens or feeds differ"
