"""What every benchmark shares: step timing with percentiles, and results that can be compared.

On CUDA a step is timed with CUDA events (the stream is idle before each step, so the span
from the start event to the end event covers the host work that enqueues the step and the GPU
work it runs); on the CPU with ``time.perf_counter``. Each run writes a new JSON file named by
its UTC time, with the arguments, git commit, device and library versions: an earlier run is
never overwritten.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import torch

from graphrt import __version__
from graphrt.kernels import tuning
from graphrt.tools.cli.env import environment

#: Untimed steps before each measurement (allocator, caches, lazy kernel loading).
WARMUP = 3


def time_us(
    fn: Callable[[], object],
    iters: int,
    device: torch.device,
    host_only: bool = False,
    setup: Callable[[], object] | None = None,
) -> list[float]:
    """``iters`` samples of ``fn()`` in µs: to the device being done, or (``host_only``) to return.

    ``setup`` runs before every call (warm-ups too), outside the timed span: e.g. rewinding a
    cache so that each sample repeats the same step.
    """
    setup = setup or _nothing
    for _ in range(WARMUP):
        setup()
        fn()
    if device.type == "cuda" and not host_only:
        return _cuda_events_us(fn, iters, device, setup)
    samples = []
    for _ in range(iters):
        setup()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - start) * 1e6)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return samples


def _nothing() -> None:
    return None


def _cuda_events_us(
    fn: Callable[[], object], iters: int, device: torch.device, setup: Callable[[], object]
) -> list[float]:
    pairs = []
    for _ in range(iters):
        setup()
        torch.cuda.synchronize(device)  # NOTE: an idle stream, so the start event fires at once
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        pairs.append((start, end))
    torch.cuda.synchronize(device)
    return [s.elapsed_time(e) * 1e3 for s, e in pairs]


def percentiles(samples: list[float]) -> dict[str, float]:
    """``{"p10", "p50", "p90"}`` of ``samples`` (µs)."""
    p10, p50, p90 = np.percentile(np.asarray(samples), [10, 50, 90])
    return {"p10": float(p10), "p50": float(p50), "p90": float(p90)}


def git_commit(cwd: Path | None = None) -> str | None:
    """``HEAD`` of the repository graphrt runs from (``+dirty`` with local changes), or None."""
    where = cwd or Path(__file__).resolve().parent
    try:
        head = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=where, capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=where,
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return head + ("+dirty" if dirty else "") if head else None


def header(bench: str, args: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    """The fields every result file starts with: what ran, when, on what, from which commit."""
    plain = {k: list(v) if isinstance(v, tuple) else v for k, v in vars(args).items()}
    return {
        "bench": bench,
        "timestamp": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "graphrt": __version__,
        "git_commit": git_commit(),
        "args": plain,
        "env": environment(device),
        # NOTE: the table a runtime built on this device installs (graphrt.kernels.tuning)
        "tuning": tuning.choose(tuning.device_name(device)).brief(),
    }


def write_result(result: dict[str, Any], out_dir: str | Path, stem: str) -> Path:
    """Write ``result`` as ``<out_dir>/<stem>_<UTC time>.json`` (a new file; never an old one)."""
    directory = Path(out_dir)
    directory.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    path, n = directory / f"{stem}_{stamp}.json", 1
    while path.exists():
        path, n = directory / f"{stem}_{stamp}-{n}.json", n + 1
    with path.open("x") as f:  # NOTE: "x" fails rather than overwrite a file that appeared meanwhile
        f.write(json.dumps(result, indent=2) + "\n")
    return path


def fmt_us(stats: dict[str, float]) -> str:
    """``p50 (p10–p90)`` in µs for a table cell."""
    return f"{stats['p50']:.0f} ({stats['p10']:.0f}–{stats['p90']:.0f})"


#: What a CPU run's table says instead of its speedups.
NO_CPU_SPEEDUP = (
    "speedups are not measured on the CPU: graphs are emulated there (a replay re-runs the recorded "
    "ops from Python), so an eager/graph ratio says nothing of a GPU"
)


def cpu_speedups_dropped(rows: list[dict[str, Any]], engine: str) -> list[dict[str, Any]]:
    """``rows`` with ``speedup`` None unless the graphs were real CUDA graphs."""
    if engine != "cuda":
        for r in rows:
            r["speedup"] = None
    return rows


def fmt_speedup(value: float | None, digits: int = 2) -> str:
    """``7.90x``, or ``-`` where not measured (the CPU)."""
    return "-" if value is None else f"{value:.{digits}f}x"
