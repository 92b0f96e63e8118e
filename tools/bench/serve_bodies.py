"""``graphrt bench serve --bodies plain,logprobs,schema``: request bodies against plain ones, on
one server, in one run.

Separate ``bench serve`` runs of each body moved by 10 % and more at 8 and 32 clients, which is
the size of what the comparison looks for. Here one ``graphrt serve`` answers every body: after
a warm-up of each body at every concurrency, each concurrency runs ``--repeats`` rounds, and a
round sends every body's load once (the bodies in turn, so a drift of the host touches them
alike). Per concurrency and body: tokens/s and TPOT p50 of each round, their medians, and the
median tokens/s over plain's (``x_plain``). Greedy replies must come back the same in every
round of a body at concurrency 1 (``same_replies_across_rounds``; the command exits 1 if not). Writes
``<out>/serve_bodies_<device>_<model>_<UTC time>.json``.
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.table import Table

from graphrt.tools.bench.record import header, write_result
from graphrt.tools.bench.serve_load import Load, run_load
from graphrt.tools.bench.serve_peers import Server

#: The bodies by name: the fields each adds to a plain greedy chat request.
SCHEMA = {
    "type": "object",
    "properties": {"answer": {"type": "string"}, "steps": {"type": "array", "items": {"type": "string"}}},
    "required": ["answer", "steps"],
}
BODIES: dict[str, dict[str, Any]] = {
    "plain": {},
    "logprobs": {"logprobs": True, "top_logprobs": 5},
    "schema": {
        "response_format": {"type": "json_schema", "json_schema": {"name": "answer", "schema": SCHEMA}}
    },
}


def body_names(text: str) -> list[str]:
    """``--bodies``: names of :data:`BODIES`, comma-separated, plain first (added if missing)."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = sorted(set(names) - set(BODIES))
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown bodies {unknown}: choose from {sorted(BODIES)}")
    return ["plain", *(n for n in dict.fromkeys(names) if n != "plain")]


def _rounds(
    server: Server, sizes: tuple[int, ...], prompts: Callable[[int], list[str]], tokens: int,
    bodies: list[str], repeats: int, say: Callable[[str], None],
) -> dict[int, dict[str, list[Load]]]:  # fmt: skip
    """Every body's loads per concurrency, ``repeats`` rounds of the bodies in turn."""
    for c in sizes:  # NOTE: warm-up, untimed: each body's graphs and grammars at every batch size
        for body in bodies:
            run_load(server.url, server.model, prompts(c), c, min(tokens, 16), BODIES[body])
    loads: dict[int, dict[str, list[Load]]] = {c: {b: [] for b in bodies} for c in sizes}
    for c in sizes:
        for k in range(repeats):
            for body in bodies:
                say(f"concurrency {c}, round {k + 1}/{repeats}: {body}")
                loads[c][body].append(run_load(server.url, server.model, prompts(c), c, tokens, BODIES[body]))
    return loads


def _summary(loads: list[Load], plain: float | None) -> dict[str, Any]:
    runs = [load.summary() for load in loads]
    rates = [r["throughput_tok_s"] for r in runs]
    tpots = [t for r in runs if (t := (r["tpot_ms"] or {}).get("p50")) is not None]
    median = statistics.median(rates)
    return {
        "throughput_tok_s": rates,
        "tpot_p50_ms": tpots,
        "median_tok_s": round(median, 2),
        "median_tpot_p50_ms": round(statistics.median(tpots), 3) if tpots else None,
        "x_plain": round(median / plain, 3) if plain else None,
        "client_cpu_share": max(r["client_cpu_share"] or 0.0 for r in runs),
    }


def _same_across_rounds(loads: dict[str, list[Load]]) -> dict[str, bool]:
    """Per body: whether its greedy replies were equal in every round."""
    texts = {b: [[s.text for s in load.samples] for load in runs] for b, runs in loads.items()}
    return {b: all(t == runs[0] for t in runs[1:]) for b, runs in texts.items()}


def run_bench_bodies(
    args: argparse.Namespace, device: Any, sizes: tuple[int, ...], tokens: int,
    prompts: Callable[[int], list[str]], server: Server, say: Callable[[str], None],
) -> tuple[dict[str, Any], Path]:  # fmt: skip
    """Every body's rounds on ``server`` (stopped after); the result, written, and its path.
    ``prompts(c)``: the prompts of one load at concurrency ``c``."""
    try:
        loads = _rounds(server, sizes, prompts, tokens, args.bodies, args.repeats, say)
    finally:
        server.stop()
    rows = []
    for c, per_body in loads.items():
        plain = _summary(per_body["plain"], None)["median_tok_s"]
        rows.append({"concurrency": c, "bodies": {b: _summary(runs, plain) for b, runs in per_body.items()}})
    result = {
        **header("serve_bodies", args, device),
        "model": args.model,
        "max_tokens": tokens,
        "repeats": args.repeats,
        "bodies": {b: BODIES[b] for b in args.bodies},
        "graphrt_ready_s": round(server.started_s, 2),
        "same_replies_across_rounds": _same_across_rounds(loads[1]) if 1 in loads else None,
        "rows": rows,
    }
    out = write_result(result, args.out, f"serve_bodies_{device.type}_{Path(args.model).stem}")
    return result, out


def print_bodies(result: dict[str, Any], out: Path, console: Any) -> None:
    table = Table(title=f"graphrt serve, bodies against plain — {result['model']}, {result['env']['device']}")
    for col in ("clients", "body", "tok/s (median)", "x plain", "TPOT p50 ms", "rounds tok/s"):
        table.add_column(col, justify="right", no_wrap=True)
    for row in result["rows"]:
        for body, s in row["bodies"].items():
            rounds = " ".join(f"{r:.0f}" for r in s["throughput_tok_s"])
            tpot = "-" if s["median_tpot_p50_ms"] is None else f"{s['median_tpot_p50_ms']:.2f}"
            table.add_row(
                str(row["concurrency"]),
                body,
                f"{s['median_tok_s']:.1f}",
                f"{s['x_plain']:.2f}x",
                tpot,
                rounds,
            )
    table.caption = (
        f"{result['repeats']} rounds, bodies in turn; {result['max_tokens']} tokens a reply; "
        f"same greedy replies in every round at 1 client: {result['same_replies_across_rounds']}"
    )
    console.print(table)
    console.print(f"written to {out}")
