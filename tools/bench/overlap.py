"""``graphrt bench overlap``: does the engine keep the GPU busy? Overlap on vs off, same run.

For each batch size, two engines of ``--engine-model`` (default tiny-llama) (``overlap=False`` and ``overlap=True``) decode the
same ``bs`` prompts of ``--context`` tokens (every request's budget outlasts the window, so
the batch stays at ``bs``). After a warm-up, two windows of ``--iters`` calls of ``Engine.step()``:

- **clean** (no profiler): the wall time per step (host ``perf_counter``, a sync at the end),
  each ``step()``'s host time, and CUDA events recorded around every graph replay
  (:class:`ReplayClock`): ``gap_us`` is the time from the end of one replay to the start of
  the next on the device's clock (uploads and copies in between count as gap);
- **profiled** (``torch.profiler``, CUDA activity only): ``busy_us``, the union of device
  intervals (kernels and copies) per step, so ``ratio = clean wall time / busy_us`` (1.0: the
  GPU never waits for the host); ``profiled_gap_us``: idle time between replays with uploads
  and copies counted busy, found by matching a bare replay's op names in the step's periodic
  op sequence. NOTE: the profiler slows every launch (CUPTI), which is why wall, host and
  ``gap_us`` come from the clean window.

The tokens of both engines are compared (``tokens_equal``). On the CPU the same steps run and
the tokens are compared, but there are no device intervals: busy, ratio and gaps are null.
JSON: ``<out>/overlap_<UTC time>.json``.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from rich.table import Table

from graphrt import Engine, ForwardMode, SamplingParams
from graphrt.buffers.stream import current_stream
from graphrt.tools.bench.device_ops import Op, device_ops, union_us
from graphrt.tools.bench.record import header, percentiles, write_result
from graphrt.tools.cli.args import resolve_backend, resolve_device
from graphrt.tools.cli.console import wide_console

WARMUP = 8  # steps after the prefill before the window


def replay_gaps(ops: Sequence[Op], steps: int, replay: Sequence[str]) -> list[float] | None:
    """Idle µs between consecutive replays, or None when the steps' op sequence is not periodic
    or holds no run of ``replay`` (the op names of one bare replay)."""
    ops = sorted(ops, key=lambda o: o.start)
    k = len(replay)
    if not k or steps < 2 or len(ops) % steps:
        return None
    period = len(ops) // steps
    names = [o.name for o in ops[:period]]
    offset = next((i for i in range(period - k + 1) if names[i : i + k] == list(replay)), None)
    if offset is None:
        return None
    runs = [ops[i * period + offset : i * period + offset + k] for i in range(steps)]
    gaps = []
    for i in range(steps - 1):
        end, start = max(o.end for o in runs[i]), runs[i + 1][0].start
        between = ops[i * period + offset + k : (i + 1) * period + offset]
        gaps.append(max(start - end, 0.0) - union_us(between, end, start))
    return gaps


class ReplayClock:
    """CUDA events around every graph replay of an engine (bench instrumentation, CUDA only).

    Events come from a pool made up front, so timing adds two ``record`` calls per replay and
    no allocation; :meth:`gaps_us` reads them after a sync.
    """

    def __init__(self, engine: Engine, replays: int) -> None:
        self.on, self.used, self.device = False, 0, engine.device
        self.cuda = engine.device.type == "cuda"
        n = 2 * replays if self.cuda else 0
        self.events = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
        for graph in engine.runtime.dispatcher.graphs.values():
            graph.replay = self._timed(graph.replay)  # type: ignore[method-assign]

    def _timed(self, replay: Any) -> Any:
        def timed() -> None:
            if not (self.on and self.used + 2 <= len(self.events)):
                return replay()
            stream = current_stream(self.device)  # NOTE: cached: Event.record() alone looks it up slowly
            self.events[self.used].record(stream)
            replay()
            self.events[self.used + 1].record(stream)
            self.used += 2
            return None

        return timed

    def gaps_us(self) -> list[float]:
        """Device µs from the end of each timed replay to the start of the next."""
        ev = self.events[: self.used]
        return [ev[i + 1].elapsed_time(ev[i + 2]) * 1e3 for i in range(0, len(ev) - 2, 2)]


@dataclass(slots=True)
class Measured:
    wall_us: float  # per step, host clock, synchronised at the end (clean window)
    host_us: list[float]  # each step() call (clean window)
    gaps_us: list[float]  # device idle between replays, CUDA events (clean window)
    ops: list[Op]  # device intervals (profiled window)
    tokens: list[list[int]]


def _window(engine: Engine, steps: int) -> tuple[float, list[float]]:
    """``steps`` calls of ``engine.step()``: wall µs per step (synced at the end) and each call's µs."""
    host = []
    start = time.perf_counter()
    for _ in range(steps):
        t = time.perf_counter()
        engine.step()
        host.append((time.perf_counter() - t) * 1e6)
    if engine.device.type == "cuda":
        torch.cuda.synchronize(engine.device)
    return (time.perf_counter() - start) * 1e6 / steps, host


#: ``--sampled``: a seeded top-p draw (the same stream of tokens in both engines).
TOP_P = SamplingParams(temperature=0.8, top_p=0.9, seed=1)


def measure(
    engine: Engine, prompts: list[list[int]], steps: int, sampling: SamplingParams | None = None
) -> Measured:
    """Prefill ``prompts``, warm up, time a clean and a profiled window of ``steps`` decode
    steps each, then finish every request."""
    ids = [engine.add_request(p, 1 + WARMUP + 2 * steps + 2, sampling) for p in prompts]
    clock = ReplayClock(engine, steps)
    for _ in range(1 + WARMUP):
        engine.step()
    clock.on = True
    wall, host = _window(engine, steps)
    clock.on = False
    with device_ops(engine.device) as ops:
        _window(engine, steps)
    while engine.waiting or engine.running:
        engine.step()
    engine.step()  # NOTE: an overlapped engine may hold one step nobody needs any more
    return Measured(
        wall, host, clock.gaps_us() if clock.cuda else [], ops, [engine.finished[i].output for i in ids]
    )


def bare_replay(engine: Engine, bs: int) -> list[str]:
    """Device op names of one replay of the DECODE graph for ``bs`` (run after every request
    finished: it rewrites only freed rows and slots)."""
    graph = engine.runtime.dispatcher.graphs.get((ForwardMode.DECODE, bs))
    if graph is None:
        return []
    with device_ops(engine.device) as ops:
        graph.replay()
    return [o.name for o in sorted(ops, key=lambda o: o.start)]


def _row(m: Measured, steps: int, replay: list[str]) -> dict[str, Any]:
    busy = union_us(m.ops) / steps if m.ops else None
    profiled_gaps = replay_gaps(m.ops, steps, replay) if m.ops else None
    return {
        "wall_us": m.wall_us,
        "host_us": percentiles(m.host_us),
        "busy_us": busy,
        "ratio": m.wall_us / busy if busy else None,
        "gap_us": percentiles(m.gaps_us) if m.gaps_us else None,
        "profiled_gap_us": percentiles(profiled_gaps) if profiled_gaps else None,
        "device_ops_per_step": len(m.ops) / steps if m.ops else None,
    }


def run_bench_overlap(args: argparse.Namespace) -> int:
    device = resolve_device(args.device)
    backend = resolve_backend(args.backend, device)
    sizes = sorted(set(args.batch_sizes))
    kw = {"device": device, "backend": backend, "buckets": sizes, "max_batch_size": sizes[-1]}
    steps = args.iters
    context = args.context + 1 + WARMUP + 2 * steps + 2
    model = args.engine_model
    engines = {on: Engine(model, overlap=on, max_context_len=context, **kw) for on in (False, True)}
    sampling = TOP_P if args.sampled else None
    rng = np.random.default_rng(0)
    rows = []
    for bs in sizes:
        prompts = [rng.integers(0, 512, args.context).tolist() for _ in range(bs)]
        runs = {on: measure(engines[on], prompts, steps, sampling) for on in (False, True)}
        replay = bare_replay(engines[False], bs)
        row = {"bs": bs, "tokens_equal": runs[False].tokens == runs[True].tokens}
        row |= {("on" if on else "off"): _row(runs[on], steps, replay) for on in (False, True)}
        rows.append(row)
    result = {
        **header("overlap", args, device),
        "model": model,
        "sampling": "top_p=0.9, temperature=0.8, seed=1" if args.sampled else "greedy",
        "backend": backend,
        "steps": steps,
        "prompt_len": args.context,
        "rows": rows,
    }
    out = write_result(result, args.out, "overlap")
    _print(result, str(out))
    return 0 if all(r["tokens_equal"] for r in rows) else 1


def _fmt(value: float | None, spec: str = ".0f") -> str:
    return "—" if value is None else format(value, spec)


def _print(result: dict[str, Any], out: str) -> None:
    table = Table(
        title=f"{result['model']} decode ({result['sampling']}), {result['steps']} steps, "
        f"overlap off vs on ({result['env']['device']})"
    )
    cols = (
        "bs",
        "overlap",
        "wall µs/step",
        "tokens/s",
        "host µs p50",
        "GPU busy µs",
        "wall/busy",
        "gap µs p50",
        "gap p90",
        "tokens",
    )
    for col in cols:
        table.add_column(col, justify="right")
    for row in result["rows"]:
        for key in ("off", "on"):
            m, gap = row[key], row[key]["gap_us"] or {}
            table.add_row(
                str(row["bs"]),
                key,
                _fmt(m["wall_us"]),
                _fmt(1e6 * row["bs"] / m["wall_us"]),
                _fmt(m["host_us"]["p50"]),
                _fmt(m["busy_us"]),
                _fmt(m["ratio"], ".3f"),
                _fmt(gap.get("p50"), ".1f"),
                _fmt(gap.get("p90"), ".1f"),
                "equal" if row["tokens_equal"] else "DIFFER",
            )
    table.caption = (
        "wall, host, gaps: no profiler (gaps: CUDA events around replays); busy: under the profiler; "
        "targets (overlap on): wall/busy ≤ 1.05, gap p50 ≤ 10 µs; CPU: no device intervals (—)"
    )
    console = wide_console()
    console.print(table)
    console.print(f"written to {out}")
