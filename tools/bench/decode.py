"""``graphrt bench``: tiny-llama decode step time, eager vs graph replay, per batch size.

Each step is timed from ``runtime.run(batch)`` to its output being ready, so it includes
validation, the host update, the upload and the replay (or eager forward); p10/p50/p90 of
``--iters`` steps. Each run writes ``<out>/decode_<device>_<backend>_<UTC time>.json``
(``decode_tp<N>_…`` with ``--tp N``).

With ``--tp N`` (under ``torchrun --nproc-per-node N``) every rank holds its shard of
tiny-llama and runs every step (rank 0's batch, broadcast); times are rank 0's, and only
rank 0 prints and writes.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import numpy as np
import torch
from rich.table import Table

from graphrt import Batch, ForwardMode, GraphRuntime, RuntimeConfig
from graphrt.engine.stack import build_stack
from graphrt.parallel import StepChannel, TPGroup
from graphrt.runtime import TPRuntime
from graphrt.tools.bench.record import (
    NO_CPU_SPEEDUP,
    cpu_speedups_dropped,
    fmt_speedup,
    fmt_us,
    header,
    percentiles,
    time_us,
    write_result,
)
from graphrt.tools.cli.args import under_tp
from graphrt.tools.cli.console import bench_progress, wide_console

PAGE_SIZE = 16


def slots(req: int, pages_per_req: int, start: int, stop: int) -> np.ndarray:
    """KV slots of positions ``start..stop`` of request row ``req`` (its own pages)."""
    pos = np.arange(start, stop)
    return (req * pages_per_req + pos // PAGE_SIZE) * PAGE_SIZE + pos % PAGE_SIZE


def _runtime(
    device: torch.device, max_bs: int, context: int, backend: str | None, tp: TPGroup, kv_cache_dtype: str
) -> GraphRuntime:
    """tiny-llama's runtime (this rank's shard with ``tp``, every step run by every rank)."""
    max_ctx = context + 64
    config = RuntimeConfig(
        max_batch_size=max_bs, max_context_len=max_ctx, page_size=PAGE_SIZE, backend=backend
    )
    runtime = build_stack("tiny-llama", device, config, tp=tp, kv_cache_dtype=kv_cache_dtype).runtime
    return TPRuntime(runtime, StepChannel(tp)) if tp.size > 1 else runtime  # type: ignore[return-value]


def _measure(runtime: GraphRuntime, batch: Batch, iters: int, device: torch.device) -> dict[str, Any]:
    eager = time_us(lambda: runtime.run(batch, eager=True), iters, device)
    graph = time_us(lambda: runtime.run(batch), iters, device)
    host = time_us(lambda: runtime.run(batch), iters, device, host_only=True)
    diff = (runtime.run(batch).float() - runtime.run(batch, eager=True).float()).abs().max().item()
    e, g = percentiles(eager), percentiles(graph)
    return {
        "eager_us": e,
        "graph_us": g,
        "graph_host_us": percentiles(host),
        "speedup": e["p50"] / g["p50"],
        "max_abs_diff": diff,
    }


def decode_batch(bs: int, context: int, pages_per_req: int, vocab: int, rng: np.random.Generator) -> Batch:
    """DECODE of ``bs`` requests in rows ``0..bs-1``, each holding ``context`` tokens."""
    return Batch.create(
        ForwardMode.DECODE,
        input_ids=rng.integers(0, vocab, bs),
        seq_lens=[context + 1] * bs,
        req_pool_indices=list(range(bs)),
        out_cache_loc=np.concatenate([slots(r, pages_per_req, context, context + 1) for r in range(bs)]),
    )


def prefill_batch(req: int, context: int, pages_per_req: int, vocab: int, rng: np.random.Generator) -> Batch:
    """EXTEND of ``context`` random tokens into row ``req`` from position 0."""
    return Batch.create(
        ForwardMode.EXTEND,
        input_ids=rng.integers(0, vocab, context),
        seq_lens=[context],
        req_pool_indices=[req],
        out_cache_loc=slots(req, pages_per_req, 0, context),
        q_lens=[context],
    )


def run_bench(args: argparse.Namespace) -> int:
    """``graphrt bench``: writes a new result file under ``args.out`` and prints its table.

    With ``--tp N`` every rank runs it; rank 0 writes and prints.
    """
    return under_tp(args, _bench)


def _bench(args: argparse.Namespace, device: torch.device, backend: str | None, tp: TPGroup) -> int:
    sizes = list(args.batch_sizes)
    runtime = _runtime(device, max(sizes), args.context, backend, tp, args.kv_cache_dtype)
    report = runtime.capture(show_progress=tp.is_driver)
    pages_per_req = runtime.config.max_pages
    rng = np.random.default_rng(0)
    rows = []
    with bench_progress(tp.is_driver) as progress:
        task = progress.add_task("prefill", total=max(sizes) + len(sizes))
        for req in range(max(sizes)):  # prefill every request to `context` tokens, one at a time
            runtime.run(prefill_batch(req, args.context, pages_per_req, 512, rng))
            progress.advance(task)
        for bs in sizes:
            progress.update(task, description=f"DECODE bs={bs}")
            batch = decode_batch(bs, args.context, pages_per_req, 512, rng)
            rows.append({"bs": bs, **_measure(runtime, batch, args.iters, device)})
            progress.advance(task)
    result = {
        **header("decode_step", args, device),
        "model": "tiny-llama",
        "kv_cache_dtype": str(runtime.kv.dtype).removeprefix("torch."),
        "tp": tp.size,
        "context": args.context,
        "page_size": PAGE_SIZE,
        "iters": args.iters,
        "timer": "cuda events" if device.type == "cuda" else "perf_counter",
        "backend": runtime.backend.name,
        "engine": report.engine,
        "capture": {
            "graphs": len(report.graphs),
            "buckets": list(runtime.dispatcher.policy.buckets),
            "seconds": report.seconds,
            "pool_bytes": report.pool_bytes,
            "per_graph": [
                {
                    "bucket": g.key[1],
                    "seconds": g.capture_seconds,
                    "pool_bytes": g.pool_bytes,
                    "nodes": g.num_nodes,
                }
                for g in report.graphs
            ],
            "static_buffer_bytes": report.buffers.total_bytes,
        },
        "rows": cpu_speedups_dropped(rows, report.engine),
    }
    if tp.is_driver:  # NOTE: every rank measured the same steps; rank 0's times are written
        ranks = f"tp{tp.size}_" if tp.size > 1 else ""
        out = write_result(result, args.out, f"decode_{ranks}{device.type}_{runtime.backend.name}")
        _print(result, out)
    return 0


def _print(result: dict, out: Path) -> None:
    env = result["env"]
    table = Table(
        title=f"decode step, tiny-llama, context {result['context']}, TP {result.get('tp', 1)} — "
        f"{env['device']}, {result['backend']}"
    )
    for col in ("bs", "eager µs", "graph µs", "graph host µs", "speedup", "max |diff|"):
        table.add_column(col, justify="right", no_wrap=True)
    for r in result["rows"]:
        table.add_row(
            str(r["bs"]),
            fmt_us(r["eager_us"]),
            fmt_us(r["graph_us"]),
            fmt_us(r["graph_host_us"]),
            fmt_speedup(r["speedup"]),
            f"{r['max_abs_diff']:.3g}",
        )
    table.caption = "µs: p50 (p10–p90) of each step, " + result["timer"]
    if result["engine"] != "cuda":
        table.caption += "; " + NO_CPU_SPEEDUP
    console = wide_console()
    console.print(table)
    cap = result["capture"]
    console.print(
        f"capture: {cap['graphs']} graphs in {cap['seconds']:.2f} s, pool {cap['pool_bytes'] / 2**20:.1f} MiB; "
        f"written to {out}"
    )
