"""Run a function on N CPU ranks (spawned processes, gloo) with a hard deadline: a hang fails, never blocks.

``run_ranks(fn, world, *args)`` starts ``world`` processes that join one gloo group (every
collective with ``timeout_s``), call ``fn(rank, world, *args)`` and send back its result or
its error text. Results come back ordered by rank; a rank still alive at the deadline is
killed and the test fails naming it.
"""

from __future__ import annotations

import os
import socket
import time
import traceback
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch.multiprocessing as mp

RankFn = Callable[..., Any]


class RankFailed(AssertionError):
    """A rank raised (its traceback is the message) or did not finish in time."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(
    rank: int, world: int, port: int, timeout_s: float, backend: str, fn: RankFn, args: tuple, q: Any
) -> None:
    import torch
    import torch.distributed as dist

    from graphrt.parallel import shutdown

    os.environ.update(OMP_NUM_THREADS="1", GRAPHRT_TP_TIMEOUT=str(timeout_s))
    try:
        if backend == "nccl":
            torch.cuda.set_device(rank)
        dist.init_process_group(
            backend,
            init_method=f"tcp://127.0.0.1:{port}",
            rank=rank,
            world_size=world,
            timeout=timedelta(seconds=timeout_s),
        )
        result = fn(rank, world, *args)
        q.put((rank, "ok", result))
    except BaseException:
        q.put((rank, "error", traceback.format_exc()))
    finally:
        try:
            shutdown()
            if dist.is_initialized():
                dist.destroy_process_group()
        except Exception:
            pass


def run_ranks(
    fn: RankFn,
    world: int,
    *args: Any,
    timeout_s: float = 30.0,
    deadline_s: float = 240.0,
    exit_s: float = 30.0,
    backend: str = "gloo",
) -> list:
    """``[fn(0, world, *args), ..., fn(world - 1, world, *args)]``, each in its own process."""
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    port = free_port()
    procs = [
        ctx.Process(target=_entry, args=(r, world, port, timeout_s, backend, fn, args, q), daemon=True)
        for r in range(world)
    ]
    for p in procs:
        p.start()
    results: dict[int, tuple[str, Any]] = {}
    end = time.monotonic() + deadline_s
    try:
        while len(results) < world and time.monotonic() < end:
            try:
                rank, status, value = q.get(timeout=1.0)
            except Exception:
                if all(not p.is_alive() for p in procs) and q.empty():
                    break
                continue
            results[rank] = (status, value)
    finally:
        stuck = []
        for r, p in enumerate(procs):
            p.join(timeout=min(exit_s, max(1.0, end - time.monotonic())) if len(results) == world else 1.0)
            if p.is_alive():
                stuck.append(r)
                p.kill()
    missing = [r for r in range(world) if r not in results]
    if missing:
        raise RankFailed(f"rank(s) {missing} did not finish within {deadline_s} s (hang or crash)")
    if stuck:
        raise RankFailed(f"rank(s) {stuck} finished but did not exit on their own within {exit_s} s")
    errors = [f"rank {r}:\n{v}" for r, (s, v) in sorted(results.items()) if s == "error"]
    if errors:
        raise RankFailed("\n".join(errors))
    return [results[r][1] for r in range(world)]


def outcome(fn: Callable[[], Any]) -> tuple[str, str]:
    """``("ok", repr)`` or ``(exception type name, message)``: comparable across ranks."""
    try:
        return "ok", repr(fn())
    except Exception as err:
        return type(err).__name__, str(err)
