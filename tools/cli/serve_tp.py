"""``graphrt serve --tp N`` under ``torchrun --nproc-per-node N``: every rank holds its shard,
rank 0 serves.

Rank 0 runs the server of ``graphrt serve`` (uvicorn and the engine thread) on
:meth:`LLM.tp_driver`: each step it takes goes to every rank first. The other ranks build the
same engine and run rank 0's steps (:func:`~graphrt.engine.tp.tp_follow`) until it stops.
While no request comes, rank 0's :class:`~graphrt.engine.tp.Heartbeat` sends an IDLE message
every quarter of the group's timeout (``GRAPHRT_TP_TIMEOUT``), so an idle server never makes
the other ranks time out.

Stopping: Ctrl-C or SIGTERM on rank 0 drains and stops it as with one rank, then it releases
the others (STOP) and every rank exits 0. The other ranks ignore both signals: a terminal's
Ctrl-C and torchrun's forwarded signal reach every rank, and rank 0 leads the shutdown. An
error on rank 0 (the port is taken, the model has no tokenizer) reaches every rank (ABORT),
which exit 1 naming it. When rank 0 dies, the others' wait for its next step times out and
they exit 1 naming rank 0; when another rank dies, rank 0's next step or heartbeat fails and
it stops serving with exit code 1.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import time
from typing import Any

from graphrt.engine.tp import Heartbeat, tp_end, tp_follow, tp_runtimes
from graphrt.parallel import CollectiveError, shutdown
from graphrt.serve.loop import EngineLoop
from graphrt.tools.cli.serve import build_server, llm_options

log = logging.getLogger("graphrt.serve")


def run_serve_tp(args: argparse.Namespace) -> int:
    """Rank 0 serves until stopped; any other rank follows it. Returns the exit code."""
    start = time.perf_counter()
    options = llm_options(args)
    if int(os.environ.get("RANK", "0")) != 0:  # NOTE: without torchrun, init_tp says how to launch
        return _follow(args, options | {"show_progress": False})
    return _lead(args, options, start)


class _Halt:
    """Stops the server once the TP group broke (called from the engine or heartbeat thread)."""

    def __init__(self) -> None:
        self.server: Any = None
        self.failure: Exception | None = None

    def __call__(self, err: Exception) -> None:
        if self.failure is None:
            self.failure = err
            log.error("the TP group broke; stopping the server: %s", err)
        if self.server is not None:
            self.server.should_exit = True


def _lead(args: argparse.Namespace, options: dict[str, Any], start: float) -> int:
    from graphrt.llm import LLM

    llm = LLM.tp_driver(args.model, args.tp, **options)
    channel = llm.engine.channel
    halt = _Halt()
    beat = Heartbeat(channel, halt)
    beat.start()  # NOTE: before anything else: the other ranks already wait for a step
    loop = EngineLoop(llm.replies, on_failure=halt)
    error: BaseException | None = None
    try:
        halt.server = build_server(args, llm, loop, start)
        if halt.failure is None:
            halt.server.run()
    except BaseException as err:
        error = err
        raise
    finally:
        beat.stop()
        loop.stop()
        if halt.failure is None and not isinstance(error, CollectiveError):  # NOTE: else it is broken
            tp_end(channel, error)
            llm.engine.close()
            shutdown()
    if halt.failure is not None:
        print(f"graphrt serve: stopped, the TP group broke: {halt.failure}", file=sys.stderr)
        return 1
    print("graphrt serve: stopped", file=sys.stderr)
    return 0


def _follow(args: argparse.Namespace, options: dict[str, Any]) -> int:
    from graphrt.engine import Engine

    engine = Engine(args.model, tp=args.tp, **options)
    group = engine.tp
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)  # NOTE: rank 0 leads the shutdown (see the docstring)
    where = f"graphrt serve: rank {group.rank} of {group.size}"
    try:
        tp_follow(engine.channel, tp_runtimes(engine))
    except CollectiveError as err:  # NOTE: the group is broken: no shutdown to meet rank 0 at
        print(f"{where}: lost rank 0 (it died, hung or left the group): {err}", file=sys.stderr)
        return 1
    except Exception as err:
        print(f"{where}: rank 0 stopped with an error: {err}", file=sys.stderr)
        engine.close()
        shutdown()
        return 1
    engine.close()
    shutdown()
    return 0


__all__ = ["run_serve_tp"]
