"""``graphrt demo``: the same prompts through the engine with graphs and eagerly."""

from __future__ import annotations

import argparse
import os

import numpy as np
from rich.console import Console
from rich.table import Table

from graphrt.debug import parity_sweep, take_snapshot
from graphrt.engine.engine import Engine
from graphrt.parallel import shutdown
from graphrt.tools.env import environment


def demo_prompts(n: int, max_new: int, vocab: int, seed: int = 0) -> tuple[list[list[int]], list[int]]:
    """``n`` prompts of 4..64 tokens and per-prompt budgets in ``[max_new/4, max_new]``."""
    rng = np.random.default_rng(seed)
    prompts = [rng.integers(0, vocab, int(rng.integers(4, 65))).tolist() for _ in range(n)]
    budgets = rng.integers(max(1, max_new // 4), max_new + 1, n).tolist()
    return prompts, budgets


def run_demo(args: argparse.Namespace) -> int:
    tp = getattr(args, "tp", 1)
    if tp > 1 and args.snapshot:
        raise SystemExit("graphrt demo: --snapshot runs a parity sweep on one rank; use it with --tp 1")
    try:
        return _demo(args, tp)
    finally:
        if tp > 1:
            shutdown()


def _demo(args: argparse.Namespace, tp: int) -> int:
    kwargs = dict(
        device=args.device,
        max_batch_size=args.max_batch_size,
        page_size=args.page_size,
        max_context_len=args.max_context_len,
        backend=args.backend,
        record_logits=True,
        tp=tp,
    )
    rank0 = tp == 1 or int(os.environ.get("RANK", "0")) == 0
    graphed = Engine(args.model, use_graphs=True, show_progress=rank0, **kwargs)
    eager = Engine(args.model, use_graphs=False, **kwargs)
    # NOTE: only rank 0 prints; every rank runs the same steps and returns the same tokens.
    console = Console(quiet=not rank0)
    prompts, budgets = demo_prompts(args.prompts, args.max_new_tokens, graphed.model.vocab_size)
    for engine in (graphed, eager):  # NOTE: one untimed warm pass (allocator, kernels' JIT)
        engine.generate(prompts[:2], 2)
        engine.logits.clear()
    graphed.runtime.telemetry.sync = args.snapshot is not None  # NOTE: real replay times, not launches
    out_graph = graphed.generate(prompts, budgets)
    out_eager = eager.generate(prompts, budgets)
    if rank0:
        console.print(_table(graphed, eager, out_graph == out_eager, _max_logit_diff(graphed, eager)))
    if args.snapshot:
        write_snapshot(graphed, args.snapshot)
        console.print(f"snapshot: {args.snapshot} (+ .npz); open it with graphrt debug / graphrt inspect")
    graphed.close()
    eager.close()
    return 0 if out_graph == out_eager else 1


def write_snapshot(engine: Engine, path: str) -> None:
    """Check parity on every captured bucket (idle engine), then snapshot the runtime."""
    parity = parity_sweep(engine.runtime)
    take_snapshot(engine.runtime, path, environment=environment(engine.device), parity=parity)


def _max_logit_diff(a: Engine, b: Engine) -> float:
    rows = [
        (x - y).abs().max().item() for r in a.logits for x, y in zip(a.logits[r], b.logits[r], strict=True)
    ]
    return max(rows, default=0.0)


def _rate(engine: Engine) -> float:
    s = engine.stats()
    return s.decode_steps / s.decode_seconds if s.decode_seconds else 0.0


def _table(graphed: Engine, eager: Engine, same: bool, diff: float) -> Table:
    rt, report = graphed.runtime, graphed.capture_report
    assert report is not None
    env = environment(graphed.device)
    g_rate, e_rate = _rate(graphed), _rate(eager)
    stats = graphed.stats()
    table = Table(title="graphrt demo: graphs vs eager", show_header=True)
    table.add_column("", style="bold")
    table.add_column("value")
    rows = [
        ("device", f"{env['device']} (torch {env['torch']})"),
        ("tensor parallel", f"{graphed.tp.size} rank(s), output from rank 0"),
        (
            "capture engine",
            report.engine + (" (CUDA graphs)" if report.engine == "cuda" else " (CPU, graph semantics)"),
        ),
        (
            "attention backend",
            rt.backend.name + ("" if rt.backend.name == "fa3" else " (FA3 unavailable here)"),
        ),
        ("requests / tokens", f"{len(graphed.finished) - 2} / {stats.generated_tokens}"),
        ("tokens identical", "[green]yes[/]" if same else "[red]NO[/]"),
        ("max |logit diff|", f"{diff:.3g}"),
        ("decode steps/s, graphs", f"{g_rate:,.1f}"),
        ("decode steps/s, eager", f"{e_rate:,.1f}"),
        ("speedup", f"{g_rate / e_rate:.2f}x" if e_rate else "-"),
        (
            "graphs captured",
            f"{len(report.graphs)} (buckets {', '.join(str(b) for b in rt.dispatcher.policy.buckets)})",
        ),
        ("capture time", f"{report.seconds:.2f} s"),
        ("graph pool memory", f"{report.pool_bytes / 2**20:.1f} MiB"),
        ("static metadata buffers", f"{report.buffers.total_bytes / 2**10:.1f} KiB"),
        (
            "replays / eager fallbacks",
            f"{sum(stats.replays.values())} / {sum(sum(r.values()) for r in stats.fallbacks.values())}",
        ),
    ]
    for key, value in rows:
        table.add_row(key, value)
    return table


__all__ = ["demo_prompts", "run_demo", "write_snapshot"]
