"""Every rank runs the same steps: rank 0's batch is broadcast before any rank runs it.

:class:`TPRuntime` wraps one rank's :class:`GraphRuntime`. ``run`` is called on every rank
(SPMD) or, on ranks other than 0, by :func:`serve`; either way each rank runs the batch rank 0
passed, so every rank validates the same arrays, picks the same bucket, falls back for the
same reason and raises the same error — no rank waits in a collective another one skipped.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from typing import Any

import torch

from graphrt.parallel import CollectiveError, Feed, Message, Op, StepChannel
from graphrt.parallel.ops import stalled_sum
from graphrt.runtime.feed import StepFeed
from graphrt.runtime.runtime import GraphRuntime
from graphrt.step.batch import Batch


class TPRuntime:
    """One rank's runtime in a TP group; other attributes pass through to ``inner``.

    ``target`` tells the runtimes of one engine apart (0: the target model, 1: the draft).
    """

    def __init__(self, inner: GraphRuntime, channel: StepChannel, target: int = 0) -> None:
        self.inner, self.channel, self.target = inner, channel, target
        # NOTE: a lazy capture's outcome is agreed on by every rank before any replays it
        inner.capturer.agree = channel.group.all_true

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    @property
    def rank(self) -> int:
        return self.channel.group.rank

    def run(self, batch: Batch | None, *, eager: bool = False, feed: StepFeed | None = None) -> torch.Tensor:
        """Run rank 0's ``batch`` (and ``eager``, and whether it has a token ``feed``) on every
        rank; other ranks' arguments are ignored, and a rank without a feed uses its runtime's.

        Safe from several threads: the channel's lock spans a step's send and its run, so
        every rank runs the steps in one order.
        """
        kind = Feed.NONE if feed is None else Feed.GATHER if feed.gather else Feed.RECORD
        mine = Message(Op.RUN, self.target, eager, batch, kind) if self.rank == 0 else None
        with self.channel.lock:  # NOTE: threads: every rank runs the steps in the order sent
            msg = self.channel.exchange(mine)
            if msg.op is not Op.RUN or msg.target != self.target:
                raise RuntimeError(
                    f"rank {self.rank}: expected a step for runtime {self.target}, rank 0 sent "
                    f"{msg.op.name} for runtime {msg.target}"
                )
            return self.step(msg, feed)

    def step(self, msg: Message, feed: StepFeed | None = None) -> torch.Tensor:
        """Run a step already received (by :func:`serve`).

        A CUDA error after a p2p sum timed out waiting for a peer (its kernel traps) is raised
        as :class:`CollectiveError` naming this rank, the peer and the timeout.
        """
        assert msg.batch is not None
        try:
            return self.inner.run(msg.batch, eager=msg.eager, feed=self._feed(msg.feed, feed))
        except CollectiveError:
            raise
        except RuntimeError as err:
            why = stalled_sum()
            if why is None:
                raise
            raise CollectiveError(why) from err

    def _feed(self, kind: Feed, given: StepFeed | None) -> StepFeed | None:
        """The feed rank 0's step names: ``given`` (rank 0's), else this rank's runtime's own.

        Every rank samples the same tokens (same logits, same sampling parameters), so a
        serving rank's own feed holds what rank 0's holds.
        """
        if kind is Feed.NONE:
            return None
        tokens = given.tokens if given is not None else self.inner.tokens
        if tokens is None:
            raise ValueError(f"rank {self.rank}: a fed step needs a runtime with sampling (sample=True)")
        return tokens.decode if kind is Feed.GATHER else tokens.prefill

    def release(self) -> None:
        self.inner.release()


#: Step errors :func:`serve` returns (the latest).
KEPT_ERRORS = 16


def serve(channel: StepChannel, runtimes: Mapping[int, TPRuntime]) -> tuple[Message, list[Exception]]:
    """A non-zero rank's loop: run each step rank 0 broadcasts until it sends STOP or ABORT.

    IDLE messages (an idle server's heartbeat) only restart the wait for the next step. A step
    that raises here raised on rank 0 too (same batch, same checks); the error is kept and the
    loop goes on, since rank 0 decides whether to continue. Returns the final message and the
    last :data:`KEPT_ERRORS` errors seen (without their tracebacks: a server runs for days).
    """
    if channel.group.is_driver:
        raise RuntimeError("rank 0 drives the steps; serve() runs on the other ranks")
    errors: deque[Exception] = deque(maxlen=KEPT_ERRORS)
    while True:
        msg = channel.exchange(None)
        if msg.op is Op.IDLE:
            continue
        if msg.op is not Op.RUN:
            return msg, list(errors)
        runtime = runtimes.get(msg.target)
        if runtime is None:
            raise RuntimeError(
                f"rank {channel.group.rank}: rank 0 sent a step for unknown runtime {msg.target}"
            )
        try:
            runtime.step(msg)
        except CollectiveError:
            raise
        except (ValueError, RuntimeError) as err:
            errors.append(err.with_traceback(None))
