"""Device intervals of a block of work (``torch.profiler``, CUDA activity only) and what benches
read from them: the busy time (union of intervals) and a per-kernel breakdown of a replayed step.

CPU op tracing stays off: it would slow the host path the benches measure.
"""

from __future__ import annotations

import contextlib
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch


@dataclass(frozen=True, slots=True)
class Op:
    """One device interval (µs): a kernel, a copy or a memset."""

    name: str
    start: float
    end: float


def union_us(ops: Sequence[Op], lo: float = -np.inf, hi: float = np.inf) -> float:
    """Length of the union of ``ops`` clipped to ``[lo, hi]``."""
    total, reach = 0.0, lo
    for op in sorted(ops, key=lambda o: o.start):
        start, end = max(op.start, reach), min(op.end, hi)
        if end > start:
            total += end - start
        reach = max(reach, min(op.end, hi))
    return total


@contextlib.contextmanager
def device_ops(device: torch.device) -> Iterator[list[Op]]:
    """Collect the device intervals of the block (synchronised at both ends); none on the CPU."""
    ops: list[Op] = []
    if device.type != "cuda":
        yield ops
        return
    torch.cuda.synchronize(device)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        yield ops
        torch.cuda.synchronize(device)
    for e in prof.profiler.kineto_results.events():
        if e.device_type() == torch.autograd.DeviceType.CUDA and e.end_ns() > e.start_ns():
            ops.append(Op(e.name(), e.start_ns() / 1e3, e.end_ns() / 1e3))


def family(name: str) -> str:
    """A kernel's name without template arguments or parameters (``at::native::k<…>(…)`` → ``at::native::k``)."""
    name = name.removeprefix("void ")
    cut = min((i for i in (name.find("<"), name.find("(")) if i > 0), default=len(name))
    return name[:cut].strip()[:96]


def kernel_breakdown(ops: Sequence[Op], steps: int, top: int = 12) -> dict[str, Any]:
    """Per step: busy µs (union of intervals), span µs (first start to last end), the idle
    share of the span, and the ``top`` kernel groups by device time (µs and launches per step)."""
    if not ops or steps < 1:
        return {"steps": steps, "busy_us": None, "span_us": None, "idle_share": None, "kernels": []}
    span = (max(o.end for o in ops) - min(o.start for o in ops)) / steps
    busy = union_us(ops) / steps
    time_us: dict[str, float] = defaultdict(float)
    count: dict[str, int] = defaultdict(int)
    for o in ops:
        time_us[family(o.name)] += o.end - o.start
        count[family(o.name)] += 1
    ranked = sorted(time_us, key=time_us.__getitem__, reverse=True)[:top]
    kernels = [
        {
            "kernel": k,
            "us": time_us[k] / steps,
            "launches": count[k] / steps,
            "share": time_us[k] / steps / busy,
        }
        for k in ranked
    ]
    return {
        "steps": steps,
        "busy_us": busy,
        "span_us": span,
        "idle_share": 1 - busy / span if span else None,
        "launches": len(ops) / steps,
        "kernels": kernels,
    }


def profile_steps(
    step: Callable[[], object], device: torch.device, steps: int, top: int = 12
) -> dict[str, Any]:
    """:func:`kernel_breakdown` of ``steps`` calls of ``step`` run back to back (no sync between,
    so the span per step is the device's step time); all None on the CPU."""
    with device_ops(device) as ops:
        for _ in range(steps):
            step()
    return kernel_breakdown(ops, steps, top)
