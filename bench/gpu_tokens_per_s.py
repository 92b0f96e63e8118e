"""Tokens per second of ``Engine.generate`` at batch size 1 (greedy and top-p), on a GPU machine.

Usage: ``python bench/gpu_tokens_per_s.py MODEL [NEW_TOKENS]``. Prints one line per case:
tokens/s over NEW_TOKENS decode steps of ``Engine.step`` (the prefill step excluded), and wall / GPU busy over the decode steps of a profiled run.
"""

from __future__ import annotations

import sys
import time

import torch

from graphrt import Engine, SamplingParams


def decode(engine: Engine, prompt: list[int], n: int, sampling: SamplingParams | None) -> tuple[float, int]:
    """Seconds for the decode steps of one request (its prefill step excluded) and tokens made."""
    engine.add_request(prompt, n + 1, sampling)
    made = len(engine.step())  # NOTE: the prefill (and its first token)
    torch.cuda.synchronize()
    start = time.perf_counter()
    while engine.waiting or engine.running:
        made += len(engine.step())
    torch.cuda.synchronize()
    return time.perf_counter() - start, made


def busy_ratio(engine: Engine, prompt: list[int], n: int, sampling: SamplingParams | None) -> float:
    """Wall time over GPU busy time (kernel and memcpy intervals, merged) of the decode steps."""
    from torch.profiler import ProfilerActivity, profile

    engine.add_request(prompt, n + 1, sampling)
    engine.step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        start = time.perf_counter()
        while engine.waiting or engine.running:
            engine.step()
        torch.cuda.synchronize()
        wall = time.perf_counter() - start
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
        decode(engine, prompt, 8, sampling)  # NOTE: warm-up
        seconds, made = min(decode(engine, prompt, n, sampling) for _ in range(3))
        rate = (made - 1) / seconds
        ratio = busy_ratio(engine, prompt, n, sampling)
        print(f"{name}: {rate:.0f} tokens/s ({1e3 / rate:.3f} ms/token), wall/busy {ratio:.2f}")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 256)
