"""Does ``replay()`` of a graph block the host while the same graph's previous replay still runs?
``python bench/gpu_replay_block.py``: a graph of ~400 µs of small kernels; host µs of replay()
called back to back on one graph, alternating two graphs of the same work, and a lone replay on
an idle device. A diagnostic for the overlapped engine's 23 µs replay gap."""

from __future__ import annotations

import time

import numpy as np
import torch


def make_graph(x: torch.Tensor, pool=None) -> torch.cuda.CUDAGraph:
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        for _ in range(3):
            y = x
            for _ in range(200):
                y = y * 1.0001 + 0.0001
    torch.cuda.synchronize()
    with torch.cuda.graph(g, pool=pool):
        y = x
        for _ in range(200):
            y = y * 1.0001 + 0.0001
    return g


def host_us(calls, n: int = 50) -> list[float]:
    out = []
    torch.cuda.synchronize()
    for i in range(n):
        t = time.perf_counter()
        calls[i % len(calls)]()
        out.append((time.perf_counter() - t) * 1e6)
    torch.cuda.synchronize()
    return out


def main() -> None:
    x = torch.randn(1 << 20, device="cuda")
    a = make_graph(x)
    b = make_graph(x, pool=a.pool())
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    a.replay()
    end.record()
    end.synchronize()
    print(f"one replay on the device: {start.elapsed_time(end) * 1e3:.0f} us")
    for name, calls in (
        ("same graph back to back", [a.replay]),
        ("two graphs alternating", [a.replay, b.replay]),
    ):
        us = host_us(calls)
        print(
            f"{name}: host us per replay() p50 {np.median(us[5:]):.1f}, p90 {np.percentile(us[5:], 90):.1f}"
        )
    idle = []
    for _ in range(30):
        torch.cuda.synchronize()
        t = time.perf_counter()
        a.replay()
        idle.append((time.perf_counter() - t) * 1e6)
    print(f"lone replay, device idle: p50 {np.median(idle):.1f} us")


if __name__ == "__main__":
    main()
