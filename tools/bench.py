"""``graphrt bench``: tiny-llama decode step time, eager vs graph replay, per batch size.

Each step is timed from ``runtime.run(batch)`` to its output being ready (device synced),
so it includes validation, the host update, the upload and the replay (or eager forward).
Results go to ``bench/results/decode_<device>_<backend>.json``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from rich.console import Console
from rich.table import Table

from graphrt import Batch, ForwardMode, GraphRuntime, RuntimeConfig
from graphrt.engine.stack import build_stack
from graphrt.tools.env import environment

PAGE_SIZE = 16


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def slots(req: int, pages_per_req: int, start: int, stop: int) -> np.ndarray:
    pos = np.arange(start, stop)
    return (req * pages_per_req + pos // PAGE_SIZE) * PAGE_SIZE + pos % PAGE_SIZE


def _runtime(device: torch.device, max_bs: int, context: int, backend: str | None) -> GraphRuntime:
    max_ctx = context + 64
    config = RuntimeConfig(
        max_batch_size=max_bs, max_context_len=max_ctx, page_size=PAGE_SIZE, backend=backend
    )
    return build_stack("tiny-llama", device, config).runtime


def time_us(fn: Callable[[], object], iters: int, device: torch.device, host_only: bool = False) -> float:
    """Median microseconds of ``fn()``: to the device being done, or (``host_only``) to return."""
    samples = []
    for _ in range(iters):
        _sync(device)
        start = time.perf_counter()
        fn()
        if not host_only:
            _sync(device)
        samples.append((time.perf_counter() - start) * 1e6)
    _sync(device)
    return statistics.median(samples)


def run_bench(args: argparse.Namespace) -> int:
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    sizes = [int(s) for s in args.batch_sizes.split(",")]
    runtime = _runtime(device, max(sizes), args.context, args.backend)
    report = runtime.capture(show_progress=True)
    pages_per_req = runtime.config.max_pages
    rng = np.random.default_rng(0)
    for req in range(max(sizes)):  # prefill every request to `context` tokens, one at a time
        prompt = Batch.create(
            ForwardMode.EXTEND,
            input_ids=rng.integers(0, 512, args.context),
            seq_lens=[args.context],
            req_pool_indices=[req],
            out_cache_loc=slots(req, pages_per_req, 0, args.context),
            q_lens=[args.context],
        )
        runtime.run(prompt)
    rows = []
    for bs in sizes:
        batch = Batch.create(
            ForwardMode.DECODE,
            input_ids=rng.integers(0, 512, bs),
            seq_lens=[args.context + 1] * bs,
            req_pool_indices=list(range(bs)),
            out_cache_loc=np.concatenate(
                [slots(r, pages_per_req, args.context, args.context + 1) for r in range(bs)]
            ),
        )
        eager_us = time_us(lambda b=batch: runtime.run(b, eager=True), args.iters, device)
        graph_us = time_us(lambda b=batch: runtime.run(b), args.iters, device)
        host_us = time_us(lambda b=batch: runtime.run(b), args.iters, device, host_only=True)
        diff = (runtime.run(batch) - runtime.run(batch, eager=True)).abs().max().item()
        rows.append(
            {
                "bs": bs,
                "eager_us": eager_us,
                "graph_us": graph_us,
                "graph_host_us": host_us,
                "speedup": eager_us / graph_us,
                "max_abs_diff": diff,
            }
        )
    result = {
        "bench": "decode_step",
        "model": "tiny-llama",
        "context": args.context,
        "page_size": PAGE_SIZE,
        "iters": args.iters,
        "backend": runtime.backend.name,
        "engine": report.engine,
        "env": environment(device),
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
        "rows": rows,
    }
    out = Path(args.out) / f"decode_{device.type}_{runtime.backend.name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    _print(result, out)
    return 0


def _print(result: dict, out: Path) -> None:
    env = result["env"]
    table = Table(
        title=f"decode step, tiny-llama, context {result['context']} — {env['device']}, {result['backend']}"
    )
    for col in ("bs", "eager µs", "graph µs", "graph host µs", "speedup", "max |diff|"):
        table.add_column(col, justify="right")
    for r in result["rows"]:
        table.add_row(
            str(r["bs"]),
            f"{r['eager_us']:.1f}",
            f"{r['graph_us']:.1f}",
            f"{r['graph_host_us']:.1f}",
            f"{r['speedup']:.2f}x",
            f"{r['max_abs_diff']:.3g}",
        )
    console = Console()
    console.print(table)
    cap = result["capture"]
    console.print(
        f"capture: {cap['graphs']} graphs in {cap['seconds']:.2f} s, pool {cap['pool_bytes'] / 2**20:.1f} MiB; "
        f"written to {out}"
    )
