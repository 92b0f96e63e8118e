"""The engine across a TP group: rank 0 schedules and samples, the other ranks run its steps.

``Engine(model, tp=N)`` on every rank of a ``torchrun`` (or any ``torch.distributed``) world.
:func:`generate` is called on every rank: rank 0's prompts are shared first, rank 0 runs the
scheduler (each step broadcast by :class:`~graphrt.runtime.TPRuntime`), the other ranks serve
its steps; the tokens are shared at the end, so every rank returns the same lists. An error
on rank 0 reaches every rank (the same exception type, naming the rank that raised it).

A server (``graphrt serve --tp N``) drives the engine for as long as it runs: the other ranks
:func:`tp_follow` its steps, rank 0's :class:`Heartbeat` keeps their wait for the next step
within the group's timeout while no request comes, and :func:`tp_end` lets them go.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Mapping
from typing import Any

from graphrt.engine.request import GenerateCall
from graphrt.parallel import CollectiveError, Message, Op, StepChannel
from graphrt.runtime import TPRuntime, serve


def _same_error(shared: tuple[type, str], rank: int, size: int) -> BaseException:
    kind, text = shared
    note = f"{text} [raised on rank 0; seen on rank {rank} of {size}]"
    try:
        return kind(note)
    except Exception:  # NOTE: an exception type whose constructor takes other arguments
        return RuntimeError(f"{kind.__name__}: {note}")


def tp_generate(
    channel: StepChannel,
    runtimes: Mapping[int, TPRuntime],
    generate: Callable[[GenerateCall], list[list[int]]],
    call: GenerateCall,
) -> list[list[int]]:
    """``generate`` of rank 0's ``call`` on rank 0, :func:`serve` on the others; rank 0's
    result on every rank.

    Each step carries its rows' sampling parameters (:func:`~graphrt.parallel.pack`), so every
    rank samples the token rank 0 samples.
    """
    group = channel.group
    mine = dataclasses.replace(call, prompts=[list(map(int, p)) for p in call.prompts])
    shared = channel.share(mine if group.is_driver else None)
    if not group.is_driver:
        end, _ = serve(channel, runtimes)
        if end.op is Op.ABORT:
            raise _same_error(channel.share(None), group.rank, group.size)
        return channel.share(None)
    try:
        out = generate(shared)
    except CollectiveError:
        raise  # NOTE: the group is broken; the other ranks hit their own timeout
    except Exception as err:
        channel.exchange(Message(Op.ABORT))
        channel.share((type(err), str(err)))
        raise
    channel.exchange(Message(Op.STOP))
    return channel.share(out)


def tp_runtimes(engine: Any) -> dict[int, TPRuntime]:
    """An engine's runtimes by the ``target`` its steps name (0: the model, 1: its draft)."""
    return {0: engine.runtime} | ({1: engine.draft_runtime} if engine.spec is not None else {})


def tp_follow(channel: StepChannel, runtimes: Mapping[int, TPRuntime]) -> None:
    """A rank > 0 of a server: run rank 0's steps until it ends them with :func:`tp_end`.

    Returns on STOP; raises rank 0's error on ABORT; raises :class:`CollectiveError` (naming
    this rank, waiting on rank 0) when rank 0 sends nothing, not even a heartbeat, for the
    group's timeout: it died or hangs.
    """
    group = channel.group
    end, _ = serve(channel, runtimes)
    if end.op is Op.ABORT:
        raise _same_error(channel.share(None), group.rank, group.size)


def tp_end(channel: StepChannel, error: BaseException | None = None) -> None:
    """Rank 0 of a server: STOP the other ranks' :func:`tp_follow`, or (``error``) ABORT it,
    so that they raise the same error. Not after a :class:`CollectiveError`: the group is broken."""
    with channel.lock:  # NOTE: after any step or heartbeat another thread is sending
        if error is None:
            channel.exchange(Message(Op.STOP))
            return
        channel.exchange(Message(Op.ABORT))
        if isinstance(error, Exception):
            channel.share((type(error), str(error)))
        else:  # NOTE: SystemExit (uvicorn's port in use), KeyboardInterrupt: a RuntimeError there
            channel.share((RuntimeError, f"{type(error).__name__} {error}".strip()))


class Heartbeat:
    """Rank 0 of a server: an IDLE message every ``interval_s`` (default a quarter of the
    group's timeout) from its own thread, requests or not, so the other ranks' wait for the
    next step never times out while the server has no request. A beat takes the channel's
    lock, so it goes between two steps.

    A failed beat (a rank died: :class:`CollectiveError`) goes to ``on_failure`` and ends the
    beats.
    """

    def __init__(
        self,
        channel: StepChannel,
        on_failure: Callable[[Exception], None],
        interval_s: float | None = None,
    ) -> None:
        self.channel, self.on_failure = channel, on_failure
        self.interval_s = channel.group.timeout_s / 4 if interval_s is None else interval_s
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="graphrt-heartbeat", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """No beat after this returns (a beat in flight is waited for)."""
        self._done.set()
        if self._thread.is_alive():
            self._thread.join(self.channel.group.timeout_s)

    def _run(self) -> None:
        while not self._done.wait(self.interval_s):
            try:
                with self.channel.lock:
                    if self._done.is_set():
                        return
                    self.channel.exchange(Message(Op.IDLE))
            except CollectiveError as err:
                self.on_failure(err)
                return
