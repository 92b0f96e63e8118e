"""``graphrt serve``: the model behind an OpenAI-compatible HTTP API (``graphrt.serve``).

Builds the tokenizer, the engine and its graphs, then runs uvicorn. Ctrl-C stops taking
requests, says how many are in flight, gives them ``--drain-timeout`` seconds to finish, then
ends the rest (a stream with ``finish_reason: "abort"`` and ``[DONE]``, a whole reply with a
``503``) and stops the engine thread; a second Ctrl-C ends them at once, as cleanly (no
traceback). ``--tp N`` under ``torchrun``: :mod:`.serve_tp`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

from graphrt.engine.config import PREFILL_GRAPH_TOKENS
from graphrt.serve.loop import EngineLoop
from graphrt.tools.cli.args import UsageError, resolve_device
from graphrt.tools.cli.console import progress_wanted

log = logging.getLogger("graphrt.serve")


def engine_sizes(args: argparse.Namespace, cuda: bool) -> tuple[int, int]:
    """``--max-batch-size`` and ``--max-context-len``, or the device's defaults, which are
    ``graphrt.LLM``'s (a CPU's KV cache and capture are kept small: 8 requests of 1024 tokens)."""
    from graphrt.defaults import default_sizes

    sizes = default_sizes(cuda)
    return args.max_batch_size or sizes["max_batch_size"], args.max_context_len or sizes["max_context_len"]


def run_serve(args: argparse.Namespace) -> int:
    """``graphrt serve``: returns when the server stops (Ctrl-C or SIGTERM)."""
    if args.tp != 1:
        from graphrt.tools.cli.serve_tp import run_serve_tp

        return run_serve_tp(args)
    from graphrt.llm import LLM

    start = time.perf_counter()
    llm = LLM(args.model, **llm_options(args))
    loop = EngineLoop(llm.replies)
    server = build_server(args, llm, loop, start)
    try:
        server.run()
    finally:
        loop.stop()
        llm.engine.close()
    print("graphrt serve: stopped", file=sys.stderr)
    return 0


def llm_options(args: argparse.Namespace) -> dict[str, Any]:
    """The engine's options from the command line (every rank of ``--tp`` builds the same)."""
    device = resolve_device(args.device)
    batch, context = engine_sizes(args, device.type == "cuda")
    return {
        "device": device,
        "max_batch_size": batch,
        "max_context_len": context,
        "capture": getattr(args, "capture", "lazy"),  # NOTE: every rank of --tp the same
        "show_progress": progress_wanted(),
        "deterministic": args.deterministic,
        "quantization": args.quantization,
        "speculative": args.speculative,
        "max_logprobs": getattr(args, "max_logprobs", 20),
        "penalties": getattr(args, "sampling_extras", True),
        "token_masks": getattr(args, "sampling_extras", True),
        # NOTE: None: the engine's default (on wherever it combines; off with --tp)
        "prefix_caching": False if getattr(args, "no_prefix_caching", False) else None,
        "prefill_graph_tokens": getattr(args, "prefill_graph_tokens", PREFILL_GRAPH_TOKENS),
    }


def build_server(args: argparse.Namespace, llm: Any, loop: EngineLoop, start: float) -> Any:
    """uvicorn's server of ``llm`` through ``loop`` (``start``: when building began, for the
    ready line). Raises ``UsageError`` when the model has no tokenizer."""
    import uvicorn

    from graphrt.serve.app import build_app

    if llm.tokenizer is None:
        raise UsageError("--model", args.model, "has no tokenizer: graphrt serve takes and gives text")
    from graphrt.serve.guard import MAX_BODY_BYTES, api_key_from

    app = build_app(
        llm,
        loop,
        getattr(args, "served_model_name", None),
        api_key=api_key_from(args.api_key),
        max_body_bytes=MAX_BODY_BYTES if args.max_body_mb is None else int(args.max_body_mb * 2**20),
        allow_special_tokens=args.allow_special_tokens,
    )
    config = uvicorn.Config(
        app,
        host=args.host,
        port=args.port,
        log_level=args.log_level,
        timeout_graceful_shutdown=args.drain_timeout + 10,  # NOTE: a backstop; see _server
    )
    return _server(config, _ready_line(args, llm, time.perf_counter() - start), loop, args.drain_timeout)


def _ready_line(args: argparse.Namespace, llm: Any, seconds: float) -> str:
    t = llm.timings
    lazy = " lazy: each graph on first use" if llm.engine.config.capture == "lazy" else ""
    return (
        f"graphrt serve: {llm.name} on http://{args.host}:{args.port} (OpenAI API under /v1), ready in "
        f"{seconds:.1f} s (tokenizer {t['tokenizer']:.1f} s, load {t['load']:.1f} s, "
        f"capture {t['capture']:.1f} s{lazy})"
    )


def _server(config: Any, ready_line: str, loop: EngineLoop, drain_s: float) -> Any:
    """uvicorn's server, saying on stderr when it listens (tests and scripts wait for that
    line), and ending the requests still in flight ``drain_s`` after a shutdown begins."""
    import uvicorn

    class Server(uvicorn.Server):
        async def startup(self, sockets: Any = None) -> None:
            await super().startup(sockets)
            if self.started:
                print(ready_line, file=sys.stderr, flush=True)

        async def shutdown(self, sockets: Any = None) -> None:
            _say_draining(loop, drain_s)

            async def cancel_late() -> None:
                deadline = time.monotonic() + drain_s
                while time.monotonic() < deadline and not self.force_exit:
                    await asyncio.sleep(0.05)
                # NOTE: each request left ends on its own (a 503, or a stream's last chunk and
                # [DONE]), before uvicorn would cancel its task with a traceback
                await asyncio.to_thread(loop.stop)

            late = asyncio.create_task(cancel_late())
            try:
                await super().shutdown(sockets)
                if self.force_exit:  # NOTE: a second Ctrl-C: end the rest now, as cleanly
                    await late
                    await self._closed(within_s=2.0)
                    await self.lifespan.shutdown()
            finally:
                late.cancel()

        async def _closed(self, within_s: float) -> None:
            """Wait (at most ``within_s``) for the connections still open to send their last bytes."""
            deadline = time.monotonic() + within_s
            while self.server_state.connections and time.monotonic() < deadline:
                await asyncio.sleep(0.05)

        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            """Ctrl-C and SIGTERM start the graceful shutdown (a second Ctrl-C forces it).

            NOTE: uvicorn's own version raises the signal again once shut down, which asyncio
            turns into a traceback from the lifespan task; the server has stopped by then.
            """
            if threading.current_thread() is not threading.main_thread():
                yield
                return
            before = {sig: signal.signal(sig, self.handle_exit) for sig in (signal.SIGINT, signal.SIGTERM)}
            try:
                yield
            finally:
                for sig, handler in before.items():
                    signal.signal(sig, handler)

    return Server(config)


def _say_draining(loop: EngineLoop, drain_s: float) -> None:
    """One line on stderr: what the shutdown waits for, and how long."""
    s = loop.stats
    if s.running + s.waiting == 0:
        print("graphrt serve: stopping (no request in flight)", file=sys.stderr, flush=True)
        return
    print(
        f"graphrt serve: stopping: draining {s.running + s.waiting} request(s) ({s.running} running,"
        f" {s.waiting} waiting) for up to {drain_s:g} s; Ctrl-C again ends them now",
        file=sys.stderr,
        flush=True,
    )


__all__ = ["build_server", "engine_sizes", "llm_options", "run_serve"]
