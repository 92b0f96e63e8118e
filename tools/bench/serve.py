"""``graphrt bench serve``: ``graphrt serve`` against ``transformers serve`` on the same model.

Each server runs alone in a subprocess on the device; the same greedy chat requests (streamed,
``max_tokens`` each) go to it at every concurrency, after one warm-up request. Per concurrency:
TTFT and TPOT (p50/p90, client-side) and throughput (completion tokens per second of wall time),
and the ratios (peer / graphrt for times, graphrt / peer for throughput). The same-thing check:
the fraction of prompts whose greedy reply is the same text on both (at concurrency 1). Where
``transformers serve`` cannot run, transformers' ``generate`` in this process is the peer, and
the result says so. Writes ``<out>/serve_<device>_<model>_<UTC time>.json``.
"""

from __future__ import annotations

import argparse
import socket
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.table import Table

from graphrt.tools.bench.record import header, write_result
from graphrt.tools.bench.serve_bodies import print_bodies, run_bench_bodies
from graphrt.tools.bench.serve_load import Load, run_load
from graphrt.tools.bench.serve_peers import (
    PeerUnavailable,
    Server,
    generate_peer,
    hf_checkpoint,
    start_graphrt,
    start_transformers,
)
from graphrt.tools.cli.args import resolve_device
from graphrt.tools.cli.console import bench_progress, wide_console

PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain what a CUDA graph is in two sentences.",
    "List three fruits and their colours.",
    "How do plants make food?",
    "Give me a tip for learning a new language.",
    "What is 17 times 3?",
    "Describe a cat to someone who has never seen one.",
]
#: Per device: concurrencies, tokens per reply, prompts per client. The CPU's run in ~a minute.
DEFAULTS: dict[str, dict[str, Any]] = {
    "cuda": {"concurrency": (1, 8, 32), "max_tokens": 128, "waves": 4},
    "cpu": {"concurrency": (1, 8), "max_tokens": 8, "waves": 1},
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _measure(
    server: Server,
    sizes: tuple[int, ...],
    tokens: int,
    waves: int,
    say: Callable[[str], None],
    extra: dict[str, Any] | None = None,
) -> dict[int, Load]:
    try:
        run_load(server.url, server.model, PROMPTS[:1], 1, tokens, extra)  # NOTE: warm-up, untimed
        loads = {}
        for c in sizes:
            say(f"{server.name}: concurrency {c}")
            loads[c] = run_load(server.url, server.model, prompts(c * waves), c, tokens, extra)
        return loads
    finally:
        server.stop()


def prompts(n: int) -> list[str]:
    """``n`` prompts of :data:`PROMPTS`, cycled."""
    return [PROMPTS[i % len(PROMPTS)] for i in range(n)]


def _peer(args: argparse.Namespace, device: Any, sizes: tuple[int, ...], tokens: int, waves: int,
          logs: Path, say: Callable[[str], None]) -> tuple[str, str | None, dict[int, Load], float | None]:  # fmt: skip
    """The peer's loads: ``transformers serve``, else (``--peer auto``) in-process ``generate``."""
    say("transformers checkpoint of the same weights")
    checkpoint = hf_checkpoint(args.model)
    why = None
    if args.peer in ("auto", "serve"):
        try:
            batching = device.type == "cuda"
            server = start_transformers(checkpoint, device.type, free_port(), batching, logs / "peer.log")
            name = "transformers serve" + (" --continuous-batching" if batching else "")
            return name, None, _measure(server, sizes, tokens, waves, say), server.started_s
        except PeerUnavailable as err:
            if args.peer == "serve":
                raise
            why = f"transformers serve could not run here: {err}"
    loads = {}
    for c in sizes:
        say(f"transformers generate: concurrency {c}")
        loads[c] = generate_peer(checkpoint, device, prompts(c * waves), c, tokens)
    return "transformers generate (in-process, batches of the concurrency)", why, loads, None


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a and b else None


def _rows(ours: dict[int, Load], theirs: dict[int, Load]) -> list[dict[str, Any]]:
    rows = []
    for c, load in ours.items():
        mine, peer = load.summary(), theirs[c].summary() if c in theirs else None
        row = {"concurrency": c, "graphrt": mine, "peer": peer}
        if peer is not None:
            p50 = lambda s, k: (s[k] or {}).get("p50")  # noqa: E731
            row["ttft_peer_over_graphrt"] = _ratio(p50(peer, "ttft_ms"), p50(mine, "ttft_ms"))
            row["tpot_peer_over_graphrt"] = _ratio(p50(peer, "tpot_ms"), p50(mine, "tpot_ms"))
            row["throughput_graphrt_over_peer"] = _ratio(mine["throughput_tok_s"], peer["throughput_tok_s"])
        rows.append(row)
    return rows


def _run_bodies(
    args: argparse.Namespace, device: Any, sizes: tuple[int, ...], tokens: int, waves: int, logs: Path
) -> int:
    """``--bodies``: each body against plain on one server (:mod:`.serve_bodies`); exits 1
    when a body's greedy replies differed between rounds."""
    with bench_progress() as progress:
        task = progress.add_task("graphrt serve: starting", total=None)
        say = lambda what: progress.update(task, description=what)  # noqa: E731
        server = start_graphrt(args.model, device.type, free_port(), max(sizes), logs / "graphrt.log")
        per_load = lambda c: prompts(c * waves)  # noqa: E731
        result, out = run_bench_bodies(args, device, sizes, tokens, per_load, server, say)
    print_bodies(result, out, wide_console())
    return 0 if all((result["same_replies_across_rounds"] or {}).values()) else 1


def run_bench_serve(args: argparse.Namespace) -> int:
    """``graphrt bench serve``: writes a new result file under ``args.out`` and prints its table."""
    device = resolve_device(args.device)
    base = DEFAULTS["cuda" if device.type == "cuda" else "cpu"]
    sizes = tuple(args.concurrency or base["concurrency"])
    tokens, waves = args.max_tokens or base["max_tokens"], args.waves or base["waves"]
    logs = Path(tempfile.mkdtemp(prefix="graphrt-bench-serve-"))
    if getattr(args, "bodies", None):
        return _run_bodies(args, device, sizes, tokens, waves, logs)
    with bench_progress() as progress:
        task = progress.add_task("graphrt serve: starting", total=None)
        say = lambda what: progress.update(task, description=what)  # noqa: E731
        server = start_graphrt(args.model, device.type, free_port(), max(sizes), logs / "graphrt.log")
        extra = getattr(args, "body", None)
        ours = _measure(server, sizes, tokens, waves, say, extra)
        peer, why, theirs, peer_start = None, None, {}, None
        if args.peer != "none":
            peer, why, theirs, peer_start = _peer(args, device, sizes, tokens, waves, logs, say)
    same = None
    if 1 in ours and 1 in theirs:
        pairs = list(zip(ours[1].samples, theirs[1].samples, strict=True))
        same = round(sum(a.text == b.text for a, b in pairs) / len(pairs), 3)
    result = {
        **header("serve", args, device),
        "model": args.model,
        "max_tokens": tokens,
        "request_fields": extra,
        "requests_per_client": waves,
        "graphrt_ready_s": round(server.started_s, 2),
        "peer": peer or None,
        "peer_note": why,
        "peer_ready_s": None if peer_start is None else round(peer_start, 2),
        "same_text_at_concurrency_1": same,
        "rows": _rows(ours, theirs),
    }
    out = write_result(result, args.out, f"serve_{device.type}_{Path(args.model).stem}")
    _print(result, out)
    return 0


def _fmt(stats: dict[str, float] | None) -> str:
    return "-" if not stats else f"{stats['p50']:.1f} ({stats['p90']:.1f})"


def _print(result: dict[str, Any], out: Path) -> None:
    table = Table(
        title=f"graphrt serve vs {result['peer'] or 'nothing'} — {result['model']}, {result['env']['device']}"
    )
    cols = ("clients", "TTFT ms", "peer TTFT ms", "TPOT ms", "peer TPOT ms", "tok/s", "peer tok/s")
    for col in (*cols, "TTFT ×", "TPOT ×", "tok/s ×", "client CPU"):
        table.add_column(col, justify="right", no_wrap=True)
    for r in result["rows"]:
        g, p = r["graphrt"], r["peer"] or {}
        ratios = [
            r.get(k)
            for k in ("ttft_peer_over_graphrt", "tpot_peer_over_graphrt", "throughput_graphrt_over_peer")
        ]
        table.add_row(
            str(r["concurrency"]), _fmt(g["ttft_ms"]), _fmt(p.get("ttft_ms")), _fmt(g["tpot_ms"]),
            _fmt(p.get("tpot_ms")), f"{g['throughput_tok_s']:.1f}", f"{p.get('throughput_tok_s') or 0:.1f}",
            *("-" if x is None else f"{x:.2f}x" for x in ratios),
            f"{g['client_cpu_share'] or 0:.2f} of {g['client_processes']}",
        )  # fmt: skip
    table.caption = (
        f"ms: p50 (p90) per request, client-side; × : peer/graphrt for times, graphrt/peer for tok/s; "
        f"client CPU: the busiest client process's CPU share of the run (near 1: the clients bound it); "
        f"{result['max_tokens']} tokens a reply; same greedy text at 1 client: {result['same_text_at_concurrency_1']}"
    )
    if result["env"]["device"] == "cpu":
        table.caption += "; on a CPU graphrt's graphs are emulated: these times say nothing of a GPU"
    console = wide_console()
    console.print(table)
    if result["peer_note"]:
        console.print(f"note: {result['peer_note']}")
    console.print(f"written to {out}")
