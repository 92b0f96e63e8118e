"""A server's ranks on CPU (gloo): rank 0's heartbeat keeps a follower waiting past the group's
timeout; STOP releases it, ABORT raises rank 0's error there, silence times it out naming rank 0."""

from __future__ import annotations

import time

import torch

from graphrt.engine.tp import Heartbeat, tp_end, tp_follow
from graphrt.parallel import CollectiveError, StepChannel, init_tp
from tests.support.tp_util import outcome, run_ranks

TIMEOUT_S = 1.0  # NOTE: the group's timeout (the heartbeat comes every 0.25 s)


def follow_idle(rank: int, world: int, beat: bool, end: str) -> tuple[str, str]:
    """Rank 0 idles 2.5 timeouts (beating or not), then ends the follow with ``end``."""
    channel = StepChannel(init_tp(world, torch.device("cpu"), TIMEOUT_S))
    if rank != 0:
        return outcome(lambda: tp_follow(channel, {}))
    failures: list[Exception] = []
    heartbeat = Heartbeat(channel, failures.append)
    assert heartbeat.interval_s == TIMEOUT_S / 4
    if beat:
        heartbeat.start()
    time.sleep(2.5 * TIMEOUT_S)
    heartbeat.stop()
    if beat:
        tp_end(channel, None if end == "stop" else SystemExit(3))
    return "ok", repr(failures)


def test_heartbeat_keeps_an_idle_follower_and_stop_releases_it() -> None:
    results = run_ranks(follow_idle, 2, True, "stop", timeout_s=TIMEOUT_S, deadline_s=60)
    assert results == [("ok", "[]"), ("ok", "None")]


def test_abort_raises_rank0s_error_on_the_follower() -> None:
    results = run_ranks(follow_idle, 2, True, "abort", timeout_s=TIMEOUT_S, deadline_s=60)
    assert results[1] == ("RuntimeError", "SystemExit 3 [raised on rank 0; seen on rank 1 of 2]")


def test_silent_rank0_times_the_follower_out_naming_it() -> None:
    results = run_ranks(follow_idle, 2, False, "stop", timeout_s=TIMEOUT_S, deadline_s=60)
    kind, text = results[1]
    assert kind == CollectiveError.__name__, text
    assert text.startswith("rank 1 of 2: waited 1 s for step 1 from rank 0"), text
