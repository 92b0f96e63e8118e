"""Load on an OpenAI-compatible server: streamed chat requests from concurrent clients, timed.

Each request streams (SSE) and is timed on the client: time to first token (the first chunk
with text), time per output token after it, and its completion tokens (the server's ``usage``
when it sends one, else its text chunks). A run keeps ``concurrency`` requests in flight until
every prompt was sent; its throughput is all completion tokens over the run's wall time.

The clients are spread over worker processes (:func:`client_processes`): one Python process
parsing every event of many streams (a JSON chunk per token, larger with log-probabilities)
can saturate before the server does, and the bench would then measure the client. The workers
start, import and connect first, and the run's clock starts when all are ready. Each reports
its CPU time, so a run says how busy its clients were (``client_cpu_share``: the busiest
worker's CPU time over the wall time; near 1, the clients bound the run).
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import os
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson


@dataclass(frozen=True, slots=True)
class Sample:
    """One request as its client saw it (seconds)."""

    ttft_s: float
    total_s: float
    tokens: int
    text: str

    @property
    def tpot_s(self) -> float | None:
        """Time per output token after the first; None for a one-token reply."""
        return (self.total_s - self.ttft_s) / (self.tokens - 1) if self.tokens > 1 else None


@dataclass(frozen=True, slots=True)
class Load:
    """The samples of one run (in prompt order) and its wall time."""

    samples: list[Sample]
    wall_s: float
    #: The busiest client process's CPU seconds over ``wall_s`` (None: not measured).
    client_cpu_share: float | None = None
    client_processes: int = 1

    def summary(self) -> dict[str, Any]:
        """p50/p90 TTFT and TPOT in ms, throughput in tokens/s, requests and tokens."""
        ttft = [s.ttft_s * 1e3 for s in self.samples]
        tpot = [t * 1e3 for s in self.samples if (t := s.tpot_s) is not None]
        tokens = sum(s.tokens for s in self.samples)
        return {
            "requests": len(self.samples),
            "completion_tokens": tokens,
            "wall_s": round(self.wall_s, 4),
            "client_processes": self.client_processes,
            "client_cpu_share": None if self.client_cpu_share is None else round(self.client_cpu_share, 3),
            "ttft_ms": _percentiles(ttft),
            "tpot_ms": _percentiles(tpot),
            "throughput_tok_s": round(tokens / self.wall_s, 2) if self.wall_s else None,
        }


def _percentiles(values: list[float]) -> dict[str, float] | None:
    if not values:
        return None
    cuts = statistics.quantiles(values, n=10, method="inclusive") if len(values) > 1 else [values[0]] * 9
    return {"p50": round(statistics.median(values), 3), "p90": round(cuts[8], 3)}


async def _one(client: Any, url: str, body: dict[str, Any]) -> Sample:
    start = time.perf_counter()
    first, chunks, usage, text = None, 0, None, []
    async with client.stream("POST", f"{url}/v1/chat/completions", json=body) as response:
        if response.status_code != 200:
            raise RuntimeError(f"{url}: HTTP {response.status_code}: {(await response.aread())[:300]!r}")
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = orjson.loads(line[6:])
            usage = chunk.get("usage") or usage
            for choice in chunk.get("choices") or ():
                piece = (choice.get("delta") or {}).get("content")
                if piece:
                    first = first or time.perf_counter()
                    chunks += 1
                    text.append(piece)
    end = time.perf_counter()
    tokens = int(usage["completion_tokens"]) if usage else chunks
    return Sample((first or end) - start, end - start, tokens, "".join(text))


async def _run(
    url: str, model: str, prompts: Sequence[str], concurrency: int, max_tokens: int, extra: dict[str, Any]
) -> Load:
    import httpx

    gate = asyncio.Semaphore(concurrency)
    limits = httpx.Limits(max_connections=concurrency + 4)

    async def send(client: Any, prompt: str) -> Sample:
        body = {
            "model": model,
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": max_tokens,
            "temperature": 0,
            "stream": True,
            "stream_options": {"include_usage": True},
        } | extra
        async with gate:
            return await _one(client, url, body)

    async with httpx.AsyncClient(timeout=httpx.Timeout(180.0), limits=limits) as client:
        start, cpu = time.perf_counter(), time.process_time()
        samples = await asyncio.gather(*(send(client, p) for p in prompts))
        wall = time.perf_counter() - start
        return Load(list(samples), wall, (time.process_time() - cpu) / wall)


def client_processes(concurrency: int) -> int:
    """Worker processes for ``concurrency`` clients: one per client up to half this host's CPUs
    (the server and its engine thread need the rest), at most 8."""
    return max(1, min(concurrency, (os.cpu_count() or 2) // 2, 8))


def _worker(go: Any, results: Any, index: int, args: tuple) -> None:
    """One client process: ready, wait for ``go``, run its share, send its samples and CPU
    seconds."""
    url, model, prompts, concurrency, max_tokens, extra = args
    import httpx  # noqa: F401  NOTE: imported before the clock starts

    results.put(("ready", index, None))
    go.wait()
    load = asyncio.run(_run(url, model, prompts, concurrency, max_tokens, extra))
    results.put(("done", index, (load.samples, (load.client_cpu_share or 0.0) * load.wall_s)))


def run_spread(
    url: str, model: str, prompts: Sequence[str], concurrency: int, max_tokens: int,
    extra: dict[str, Any], processes: int,
) -> Load:  # fmt: skip
    """The run over ``processes`` workers: worker ``i`` sends prompts ``i::processes`` with its
    share of ``concurrency``; samples come back in prompt order."""
    ctx = mp.get_context("spawn")  # NOTE: the bench process may hold CUDA: no fork
    go, results = ctx.Event(), ctx.Queue()
    shares = [concurrency // processes + (i < concurrency % processes) for i in range(processes)]
    procs = [
        ctx.Process(
            target=_worker,
            args=(go, results, i, (url, model, list(prompts[i::processes]), shares[i], max_tokens, extra)),
            daemon=True,
        )
        for i in range(processes)
    ]
    for p in procs:
        p.start()
    try:
        for _ in procs:
            results.get(timeout=120)
        start = time.perf_counter()
        go.set()
        done = dict((i, got) for _, i, got in (results.get(timeout=600) for _ in procs))
        wall = time.perf_counter() - start
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
    samples: list[Sample | None] = [None] * len(prompts)
    for i, (mine, _cpu) in done.items():
        samples[i::processes] = mine
    busiest = max(cpu for _, cpu in done.values()) / wall
    return Load([s for s in samples if s is not None], wall, busiest, processes)


def run_load(
    url: str,
    model: str,
    prompts: Sequence[str],
    concurrency: int,
    max_tokens: int,
    extra: dict[str, Any] | None = None,
    processes: int | None = None,
) -> Load:
    """Send ``prompts`` (greedy chat requests of ``max_tokens``, with ``extra`` body fields:
    ``logprobs``, ``response_format``, ...), ``concurrency`` at a time, from ``processes``
    client processes (None: :func:`client_processes`; 1: this process)."""
    processes = min(processes or client_processes(concurrency), concurrency, len(prompts))
    if processes <= 1:
        return asyncio.run(_run(url, model, prompts, concurrency, max_tokens, extra or {}))
    return run_spread(url, model, prompts, concurrency, max_tokens, extra or {}, processes)
