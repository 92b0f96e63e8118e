"""``graphrt bench-spec``: speculative step times (verify, draft decode, draft extend), eager vs graph.

A target (tiny-llama) and a draft (tiny-llama-draft) runtime are prefilled to ``context``
tokens per request; each mode's step is timed from ``runtime.run(batch)`` to a synced output,
for a chain (``topk 1``) and a tree (``topk 2``, cascade + merge_state). Each run writes
``<out>/spec_<device>_<backend>_<UTC time>.json`` (p10/p50/p90 per step; ``spec_tp<N>_…``
with ``--tp N``: under ``torchrun --nproc-per-node N`` every rank runs every step, rank 0's
batch broadcast, and rank 0 prints and writes).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import numpy as np
import torch
from rich.table import Table

from graphrt import Batch, ForwardMode, GraphRuntime, RuntimeConfig
from graphrt.engine.stack import build_stack
from graphrt.metadata.cascade import chain_tree_mask
from graphrt.parallel import StepChannel, TPGroup
from graphrt.runtime import TPRuntime
from graphrt.step.modes import SpecGeometry
from graphrt.tools.bench.decode import PAGE_SIZE, slots
from graphrt.tools.bench.record import (
    NO_CPU_SPEEDUP,
    cpu_speedups_dropped,
    fmt_speedup,
    fmt_us,
    header,
    percentiles,
    time_us,
    write_result,
)
from graphrt.tools.cli.args import under_tp
from graphrt.tools.cli.console import bench_progress, wide_console

M = ForwardMode
GEOMETRIES = (SpecGeometry(num_steps=3), SpecGeometry(num_steps=3, topk=2, num_draft_tokens=6))


def _runtimes(
    device: torch.device, spec: SpecGeometry, max_bs: int, ctx: int, backend: str | None, tp: TPGroup
) -> tuple[GraphRuntime, GraphRuntime]:
    """Target and draft runtimes (this rank's shards with ``tp``, each step run by every rank)."""
    config = RuntimeConfig(
        max_batch_size=max_bs,
        max_context_len=ctx + 64,
        page_size=PAGE_SIZE,
        backend=backend,
        speculative=spec,
        capture_modes=(M.TARGET_VERIFY,),
    )
    rows = max_bs * (1 + spec.topk)  # NOTE: every tree branch gets a scratch row of its own
    target = build_stack("tiny-llama", device, config, max_reqs=rows, tp=tp).runtime
    draft_config = RuntimeConfig(
        **{
            f: getattr(config, f)
            for f in ("max_batch_size", "max_context_len", "page_size", "backend", "speculative")
        },
        capture_modes=(M.DRAFT_DECODE, M.DRAFT_EXTEND),
    )
    draft = build_stack("tiny-llama-draft", device, draft_config, max_reqs=rows, seed=1, tp=tp).runtime
    if tp.size == 1:
        return target, draft
    channel = StepChannel(tp)
    return TPRuntime(target, channel, 0), TPRuntime(draft, channel, 1)  # type: ignore[return-value]


def _prefill(rt: GraphRuntime, reqs: int, ctx: int, rng: np.random.Generator) -> None:
    per = rt.config.max_pages
    for r in range(reqs):
        rt.run(
            Batch.create(
                M.EXTEND,
                input_ids=rng.integers(0, 512, ctx),
                seq_lens=[ctx],
                req_pool_indices=[r],
                out_cache_loc=slots(r, per, 0, ctx),
                q_lens=[ctx],
            )
        )


def _batches(rt: GraphRuntime, spec: SpecGeometry, bs: int, ctx: int, rng: np.random.Generator) -> dict:
    per, n, k, s = rt.config.max_pages, spec.num_draft_tokens, spec.topk, spec.draft_forwards
    reqs = list(range(bs))
    mask = np.broadcast_to(chain_tree_mask(spec.num_steps, k, n), (bs, n, n)).copy() if k > 1 else None
    verify = Batch.create(
        M.TARGET_VERIFY,
        input_ids=rng.integers(0, 512, bs * n),
        seq_lens=[ctx + n] * bs,
        req_pool_indices=reqs,
        q_lens=[n] * bs,
        tree_mask=mask,
        out_cache_loc=np.concatenate([slots(r, per, ctx, ctx + n) for r in reqs]),
    )
    # NOTE: tree branches write the same positions in scratch rows past the batch (own pages).
    draft_rows = [[r] if k == 1 else [bs + r * k + j for j in range(k)] for r in reqs]
    draft = Batch.create(
        M.DRAFT_DECODE,
        input_ids=rng.integers(0, 512, bs * k),
        seq_lens=[ctx + 1] * bs,
        req_pool_indices=reqs,
        q_lens=[k] * bs,
        out_cache_loc=np.concatenate([slots(w, per, ctx, ctx + s) for rows in draft_rows for w in rows]),
    )
    accept = rng.integers(1, n + 1, bs)
    extend = Batch.create(
        M.DRAFT_EXTEND,
        input_ids=rng.integers(0, 512, int(accept.sum())),
        seq_lens=ctx + accept,
        req_pool_indices=reqs,
        q_lens=accept,
        out_cache_loc=np.concatenate(
            [slots(r, per, ctx, ctx + a) for r, a in zip(reqs, accept, strict=True)]
        ),
    )
    return {M.TARGET_VERIFY: verify, M.DRAFT_DECODE: draft, M.DRAFT_EXTEND: extend}


def _diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).abs().max()) if a.numel() else 0.0


def _measure(rt: GraphRuntime, batch: Batch, iters: int, device: torch.device) -> dict[str, Any]:
    eager = percentiles(time_us(lambda: rt.run(batch, eager=True), iters, device))
    graph = percentiles(time_us(lambda: rt.run(batch), iters, device))
    host = percentiles(time_us(lambda: rt.run(batch), iters, device, host_only=True))
    return {
        "eager_us": eager,
        "graph_us": graph,
        "graph_host_us": host,
        "speedup": eager["p50"] / graph["p50"],
        "max_abs_diff": _diff(rt.run(batch), rt.run(batch, eager=True)),
    }


def run_bench_spec(args: argparse.Namespace) -> int:
    """``graphrt bench-spec``: writes a new result file under ``args.out`` and prints its table.

    With ``--target``: the speculative engine end to end instead (``bench_spec_accept``).
    """
    if getattr(args, "target", None):
        from graphrt.tools.bench.spec_accept import run_bench_spec_accept

        return run_bench_spec_accept(args)
    return under_tp(args, _bench_spec)


def _bench_spec(args: argparse.Namespace, device: torch.device, backend_arg: str | None, tp: TPGroup) -> int:
    sizes = list(args.batch_sizes)
    rng, rows, engine, backend = np.random.default_rng(0), [], "", ""
    with bench_progress(tp.is_driver) as progress:
        task = progress.add_task("", total=len(GEOMETRIES) * len(sizes) * 3)
        for spec in GEOMETRIES:
            progress.update(task, description=f"topk {spec.topk}: capture + prefill")
            target, draft = _runtimes(device, spec, max(sizes), args.context, backend_arg, tp)
            captures = [target.capture(), draft.capture()]
            backend, engine = target.backend.name, target.engine.name
            for rt in (target, draft):
                _prefill(rt, max(sizes), args.context, rng)
            for bs in sizes:
                for mode, batch in _batches(target, spec, bs, args.context, rng).items():
                    progress.update(task, description=f"topk {spec.topk} {mode.name} bs={bs}")
                    rt = target if mode is M.TARGET_VERIFY else draft
                    row = {"topk": spec.topk, "num_draft_tokens": spec.num_draft_tokens, "mode": mode.name}
                    row |= {"bs": bs, "tokens": batch.num_tokens, **_measure(rt, batch, args.iters, device)}
                    rows.append(row)
                    progress.advance(task)
            rows[-1]["capture_seconds"] = sum(c.seconds for c in captures)
    result = {
        **header("spec_steps", args, device),
        "target": "tiny-llama",
        "draft": "tiny-llama-draft",
        "tp": tp.size,
        "num_steps": 3,
        "context": args.context,
        "page_size": PAGE_SIZE,
        "iters": args.iters,
        "timer": "cuda events" if device.type == "cuda" else "perf_counter",
        "backend": backend,
        "engine": engine,
        "rows": cpu_speedups_dropped(rows, engine),
    }
    if tp.is_driver:  # NOTE: every rank measured the same steps; rank 0's times are written
        ranks = f"tp{tp.size}_" if tp.size > 1 else ""
        _print(result, write_result(result, args.out, f"spec_{ranks}{device.type}_{backend}"))
    return 0


def _print(result: dict, out: Path) -> None:
    table = Table(
        title=f"speculative steps, context {result['context']}, TP {result.get('tp', 1)} — "
        f"{result['env']['device']}, {result['backend']}"
    )
    for col in ("topk", "mode", "bs", "tokens", "eager µs", "graph µs", "host µs", "speedup", "max |diff|"):
        table.add_column(col, justify="left" if col == "mode" else "right", no_wrap=True)
    for r in result["rows"]:
        table.add_row(
            str(r["topk"]),
            r["mode"],
            str(r["bs"]),
            str(r["tokens"]),
            fmt_us(r["eager_us"]),
            fmt_us(r["graph_us"]),
            fmt_us(r["graph_host_us"]),
            fmt_speedup(r["speedup"], 1),
            f"{r['max_abs_diff']:.3g}",
        )
    table.caption = "µs: p50 (p10–p90) of each step, " + result["timer"]
    if result["engine"] != "cuda":
        table.caption += "; " + NO_CPU_SPEEDUP
    console = wide_console()
    console.print(table)
    console.print(f"written to {out}")
