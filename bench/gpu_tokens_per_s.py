"""Tokens per second of ``Engine.generate`` at batch size 1 (greedy and top-p), on a GPU machine.

Usage: ``python bench/gpu_tokens_per_s.py MODEL [NEW_TOKENS]``. Prints one line per case:
tokens/s over NEW_TOKENS decode tokens (prefill excluded: a 1-token budget run first is
subtracted), and GPU busy / wall from a profiled run of the same generate call.
"""

from __future__ import annotations

import sys
import time

import torch

from graphrt import Engine, SamplingParams


def timed(engine: Engine, prompt: list[int], n: int, sampling: SamplingParams | None) -> float:
    torch.cuda.synchronize()
    start = time.perf_counter()
    out = engine.generate([prompt], n, sampling)
    torch.cuda.synchronize()
    assert len(out[0]) == n, f"stopped early at {len(out[0])} of {n}"
    return time.perf_counter() - start


def busy_ratio(engine: Engine, prompt: list[int], n: int, sampling: SamplingParams | None) -> float:
    """Wall time over GPU busy time (kernel and memcpy intervals, merged) of one generate call."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        wall = timed(engine, prompt, n, sampling)
    spans = sorted(
        (e.time_range.start, e.time_range.end)
        for e in prof.events()
        if e.device_type.name == "CUDA" and e.time_range.end > e.time_range.start
    )
    busy, end = 0.0, float("-inf")
    for s, e in spans:
        if e > end:
            busy += e - max(s, end)
            end = e
    return wall / (busy * 1e-6) if busy else float("nan")


def main(model: str, n: int) -> None:
    engine = Engine(model, max_batch_size=1, max_context_len=n + 64, buckets=[1])
    prompt = list(range(1, 17))
    cases = {"greedy": None, "top_p=0.9": SamplingParams(temperature=0.8, top_p=0.9, seed=1)}
    for name, sampling in cases.items():
        timed(engine, prompt, 8, sampling)  # NOTE: warm-up
        prefill = min(timed(engine, prompt, 1, sampling) for _ in range(3))
        total = min(timed(engine, prompt, n, sampling) for _ in range(3))
        rate = (n - 1) / (total - prefill)
        ratio = busy_ratio(engine, prompt, n, sampling)
        print(f"{name}: {rate:.0f} tokens/s ({1e3 / rate:.3f} ms/token), wall/busy {ratio:.2f}")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 256)
