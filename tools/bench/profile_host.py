"""``graphrt bench host --profile``: where the host time of one graphed ``run()`` goes.

Builds the bench's runtime (tiny-llama, every ``--page-sizes`` x ``--context-lens``, the emulated
engine on the CPU) and, per mode and batch size, times with ``time.perf_counter_ns``:

- ``run``: ``run()`` with the replay stubbed out (host cost only), on the decode steady state
  (each DECODE step appends the next position of every row: :class:`SteadyDecode`), and
  ``run_rewrite``: the same batch again and again (a step rewriting its own tail, as a verify
  after a verify does; for DECODE that also releases last step's slots);
- each phase of ``run()`` on its own: lock, ``Batch.check``, ``KVWrites.of``, the ledger's
  check and commit, the route (dispatch + host scalars), write + upload, telemetry, and the
  output view plus its clone;
- a ``cProfile`` of ``run()`` (``--profile-top`` functions by own time).

Prints a table (µs p50 per batch size) and writes nothing: a diagnostic, not a result.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import time
from collections.abc import Callable

import numpy as np
import torch
from rich.console import Console
from rich.table import Table

from graphrt import GraphRuntime
from graphrt.kv.ledger import KVWrites
from graphrt.step import Batch, ForwardMode
from graphrt.tools.bench.peer import make_batch, slots_of

#: Steps appended per row before its state is reset (outside the timing).
CYCLE = 64


class SteadyDecode:
    """DECODE batches that append positions ``real, real + 1, ...`` of rows ``0..bs-1``.

    The bench's rows hold ``real`` tokens and have room for :data:`CYCLE` more (``build``'s
    ``room``); :meth:`reset` rewinds every row to ``real`` (untimed) once a cycle is used up.
    """

    def __init__(self, rt: GraphRuntime, bs: int, real: int, rng: np.random.Generator) -> None:
        self.rt, self.bs, self.real, self.rng = rt, bs, real, rng
        rows = np.arange(bs, dtype=np.int64)
        self.batches = [
            Batch.create(
                ForwardMode.DECODE,
                input_ids=rng.integers(0, 100, bs),
                seq_lens=np.full(bs, real + 1 + i, dtype=np.int64),
                req_pool_indices=rows,
                out_cache_loc=np.concatenate([slots_of(rt, r, real + i, real + i + 1) for r in rows]),
            )
            for i in range(CYCLE)
        ]
        self.i = 0

    def reset(self) -> None:
        """Every row back to ``real`` valid positions (a prefill's state)."""
        make_batch("decode", self.rt, self.bs, self.real, self.rng)
        self.i = 0

    def next(self) -> Batch:
        if self.i == CYCLE:
            self.reset()
        self.i += 1
        return self.batches[self.i - 1]


def steady_us(rt: GraphRuntime, steady: SteadyDecode, iters: int) -> np.ndarray:
    """Host µs of ``run()`` per DECODE step in the steady state (resets untimed), the device
    idle before each step (as ``graphrt bench host`` times every call)."""
    return interleaved_steady_us([(rt, steady)], iters)[0]


def interleaved_steady_us(pairs: list[tuple[GraphRuntime, SteadyDecode]], iters: int) -> list[np.ndarray]:
    """:func:`steady_us` of several runtimes, their samples taken in turn (A, B, A, B, ...), so a
    host that slows down or speeds up during the run weighs on each alike."""
    for _, steady in pairs:
        steady.reset()
    out = [np.empty(iters) for _ in pairs]
    for i in range(iters):
        for (rt, steady), samples in zip(pairs, out, strict=True):
            batch = steady.next()
            if rt.device.type == "cuda":
                torch.cuda.synchronize(rt.device)
            start = time.perf_counter_ns()
            rt.run(batch)
            samples[i] = (time.perf_counter_ns() - start) / 1e3
    return out


def timed_us(fn: Callable[[], object], iters: int, undo: Callable[[], object] | None = None) -> np.ndarray:
    """Host µs of ``fn()`` per call; ``undo()`` (untimed) after each restores the state."""
    out = np.empty(iters)
    for i in range(iters):
        start = time.perf_counter_ns()
        fn()
        out[i] = (time.perf_counter_ns() - start) / 1e3
        if undo is not None:
            undo()
    return out


def stub_replays(rt: GraphRuntime) -> None:
    """Replace every graph's replay with a no-op: what is left of ``run()`` is host cost."""
    for graph in rt.dispatcher.graphs.values():
        graph.replay = lambda: None  # type: ignore[method-assign]


def phases(rt: GraphRuntime, batch: Batch, iters: int) -> dict[str, np.ndarray]:
    """Each phase of ``run()`` on its own, in the order ``run()`` takes them."""
    plan = rt.plan(batch.mode)
    ledger = rt.req_to_token.ledger
    writes = KVWrites.of(batch, scratch=plan.scratch)
    route = rt._route(batch, plan)
    assert route is not None, f"{batch.mode.name} bs={batch.bs} has no graph"
    lock = rt._lock

    def locked() -> None:
        with lock:
            pass

    def telemetry() -> None:
        start = time.perf_counter()
        rt.telemetry.replayed(plan.name, route.bs, route.bucket, start, start, rt.device)

    sampled = batch.sampling is not None
    return {
        "lock": timed_us(locked, iters),
        "validate": timed_us(lambda: batch.check(rt.limits), iters),
        "kv_writes": timed_us(lambda: KVWrites.of(batch, scratch=plan.scratch), iters),
        "kv_check": timed_us(lambda: ledger.check(writes), iters),
        "route": timed_us(lambda: rt._route(batch, plan), iters),
        "write_upload": timed_us(lambda: rt.groups.write(batch, route.bucket, route.tokens, plan.pad), iters),
        "telemetry": timed_us(telemetry, iters),
        "output": timed_us(lambda: route.result(sampled, batch.input_ids.size).clone(), iters),
        "kv_commit": timed_us(
            lambda: ledger.commit(writes), iters, lambda: ledger.truncate(writes.rows, writes.starts)
        ),
    }


def top_functions(rt: GraphRuntime, batch: Batch, iters: int, top: int) -> str:
    """``cProfile`` of ``run()`` on ``batch``: the ``top`` functions by own time."""
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(iters):
        rt.run(batch)
    profile.disable()
    text = io.StringIO()
    pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(top)
    return text.getvalue()


def profile_runtime(rt: GraphRuntime, case: str, bs: int, args: argparse.Namespace) -> dict[str, float]:
    """p50 µs of ``run()`` (steady, rewrite) and of each phase for one batch size."""
    rng = np.random.default_rng(bs)
    batch = make_batch(case, rt, bs, args.real_len, rng)
    rt.run(batch)  # NOTE: the first step routes and writes the mirror's tag; not timed
    rows: dict[str, np.ndarray] = {}
    if batch.mode is ForwardMode.DECODE:
        steady = SteadyDecode(rt, bs, args.real_len, rng)
        rows["run"] = steady_us(rt, steady, args.iters)
        steady.reset()
        # NOTE: the second step of a cycle: its position (real + 1) lies inside a page when
        # page_size > 1, as 15 of 16 decode steps do, so the page check's gather is timed.
        rt.run(steady.next())
        batch = steady.next()
    rows["run_rewrite"] = timed_us(lambda: rt.run(batch), args.iters)
    # NOTE: the phases time a step appending to its rows: drop what the runs above wrote.
    writes = KVWrites.of(batch, scratch=rt.plan(batch.mode).scratch)
    rt.req_to_token.ledger.truncate(writes.rows, writes.starts)
    rows |= phases(rt, batch, args.iters)
    if args.profile_top:
        Console().print(f"[bold]{case} bs={bs}[/]\n" + top_functions(rt, batch, args.iters, args.profile_top))
    return {k: float(np.percentile(v, 50)) for k, v in rows.items()}


def run_profile(args: argparse.Namespace, build: Callable[..., GraphRuntime], device: torch.device) -> int:
    """``graphrt bench host --profile``: one table per mode, phases × batch sizes."""
    given = args.batch_sizes or (1, 8, 64, 256)
    sizes = [int(x) for x in given.split(",")] if isinstance(given, str) else list(given)
    for case in (args.modes or "decode").split(","):
        for ps in (int(x) for x in args.page_sizes.split(",")):
            for ctx in (int(x) for x in args.context_lens.split(",")):
                rt = build(case, device, max(sizes), ps, ctx, args.real_len, room=CYCLE)
                stub_replays(rt)
                results = {bs: profile_runtime(rt, case, bs, args) for bs in sizes}
                rt.release()
                del rt
                _print_profile(
                    results, f"{case}: host µs p50 per phase (replay stubbed), ps {ps}, ctx {ctx}, {device}"
                )
    return 0


def _print_profile(results: dict[int, dict[str, float]], title: str) -> None:
    sizes = list(results)
    table = Table(title=title)
    table.add_column("phase")
    for bs in sizes:
        table.add_column(f"bs {bs}", justify="right")
    for phase in results[sizes[0]]:
        table.add_row(phase, *(f"{results[bs].get(phase, float('nan')):.1f}" for bs in sizes))
    # NOTE: what run() spends outside the phases timed one by one (cold caches, glue); modes
    # other than DECODE time only the rewriting run().
    rest = {
        bs: r.get("run", r["run_rewrite"]) - sum(v for k, v in r.items() if k not in ("run", "run_rewrite"))
        for bs, r in results.items()
    }
    table.add_row("run - phases", *(f"{rest[bs]:.1f}" for bs in sizes))
    Console(width=160).print(table)
