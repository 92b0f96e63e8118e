"""``graphrt bench buckets``: padded tokens of the default ladder vs the one the workload picks.

A trace of DECODE batch sizes (``--trace file.jsonl``: one int or one ``{"bs": N, ...}`` object
per line; without it a continuous-batching trace is generated: Poisson arrivals, each running
request finishing with a fixed chance per step) is turned into the histogram the runtime's
telemetry keeps, and the ladder :meth:`GraphRuntime.suggest_buckets` would choose for it
(the same :func:`step_weights` and :func:`optimal_buckets`) is compared with the default one:
padded token rows, graphs, steps that run eagerly. Nothing is captured or run: padding is a
function of the ladder and the trace. JSON under ``--out`` (never overwritten).
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import torch
from rich.table import Table

from graphrt.capture import BucketPolicy, optimal_buckets, padded_tokens
from graphrt.runtime.telemetry import step_weights
from graphrt.tools.bench.record import header, write_result
from graphrt.tools.cli.args import UsageError
from graphrt.tools.cli.console import wide_console

MODE = "DECODE"


def read_trace(path: str) -> list[int]:
    """Batch sizes of a ``.jsonl`` trace: each line an int ≥ 1 or an object with ``"bs"``."""
    file = Path(path)
    if not file.is_file():
        raise UsageError("--trace", path, "is not a file")
    sizes = []
    for n, line in enumerate(file.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError:
            item = None
        bs = item.get("bs") if isinstance(item, dict) else item
        if isinstance(bs, bool) or not isinstance(bs, int) or bs < 1:
            raise UsageError(
                "--trace", path, f'line {n}: {line.strip()[:60]!r} is not a bs >= 1 or {{"bs": N}}'
            )
        sizes.append(bs)
    if not sizes:
        raise UsageError("--trace", path, "holds no batch sizes")
    return sizes


def generate_trace(steps: int, mean_bs: int, max_bs: int, seed: int) -> list[int]:
    """Continuous batching: each step ``mean_bs / 64`` arrivals on average (Poisson), each
    running request finishes with chance 1/64; the batch never exceeds ``max_bs``. Starts at
    ``mean_bs`` running; a step with nothing running is no step."""
    rng = np.random.default_rng(seed)
    running, sizes = mean_bs, []
    while len(sizes) < steps:
        running -= int(rng.binomial(running, 1 / 64))
        running = min(running + int(rng.poisson(mean_bs / 64)), max_bs)
        if running:
            sizes.append(running)
    return sizes


def _ladder_row(name: str, ladder: tuple[int, ...], weights: dict[int, int], real: int) -> dict[str, Any]:
    pad = padded_tokens(weights, ladder)
    return {
        "ladder": name,
        "buckets": list(ladder),
        "graphs": len(ladder),
        "padded_tokens": pad,
        "padded_fraction": pad / max(real, 1),
    }


def run_bench_buckets(args: argparse.Namespace) -> int:
    max_bs = args.max_batch_size
    if args.trace is not None:
        sizes = read_trace(args.trace)
    else:
        if args.mean_bs > max_bs:
            raise UsageError("--mean-bs", args.mean_bs, f"exceeds --max-batch-size {max_bs}")
        sizes = generate_trace(args.steps, args.mean_bs, max_bs, args.seed)
    counts = {(MODE, bs): n for bs, n in Counter(sizes).items()}
    weights = step_weights(counts, [MODE], lambda _: 1, max_bs)
    if not weights:
        raise UsageError(
            "--trace", args.trace, f"has no step of at most {max_bs} requests (--max-batch-size)"
        )
    default = BucketPolicy.create(max_bs).buckets
    max_graphs = args.max_graphs or len(default)
    suggested = optimal_buckets(weights, max_graphs, max_bs)
    real = sum(bs for bs in sizes if bs <= max_bs)
    before, after = (
        _ladder_row(n, lad, weights, real) for n, lad in (("default", default), ("suggested", suggested))
    )
    result = {
        **header("buckets", args, torch.device("cpu")),
        "trace": {
            "source": args.trace or "generated",
            "steps": len(sizes),
            "real_tokens": real,
            "eager_steps": sum(bs > max_bs for bs in sizes),
            "distinct_sizes": len(weights),
        },
        "max_batch_size": max_bs,
        "max_graphs": max_graphs,
        "ladders": [before, after],
        "saved_fraction": 1 - after["padded_tokens"] / before["padded_tokens"]
        if before["padded_tokens"]
        else 0.0,
    }
    out = write_result(result, args.out, "buckets")
    _print(result, out)
    return 0


def _print(result: dict[str, Any], out: Path) -> None:
    trace = result["trace"]
    table = Table(
        title=f"padded tokens, {trace['steps']} DECODE steps ({trace['source']}), max_batch_size "
        f"{result['max_batch_size']}, at most {result['max_graphs']} graphs"
    )
    for col in ("ladder", "graphs", "padded tokens", "padded / real", "buckets"):
        table.add_column(col, justify="left" if col in ("ladder", "buckets") else "right")
    for row in result["ladders"]:
        table.add_row(
            row["ladder"],
            str(row["graphs"]),
            f"{row['padded_tokens']:,}",
            f"{row['padded_fraction']:.2%}",
            ", ".join(map(str, row["buckets"])),
        )
    table.caption = (
        f"real tokens {trace['real_tokens']:,}; {trace['eager_steps']} steps above max_batch_size run eagerly "
        f"(not counted); padding saved {result['saved_fraction']:.1%}"
    )
    console = wide_console()
    console.print(table)
    console.print(f"written to {out}")
