"""``graphrt bench gemm``: decode-shaped projections inside one CUDA graph, cuBLAS against the skinny
kernel (with and without PDL) and the weight-read floor.

Per projection of Llama-3.2-1B and Llama-3-8B (qkv, o, gate_up, down, lm_head; shapes from the
presets) and per ``M`` (``--batch-sizes``, default 1, 16, 64 rows): 20 distinct weights (so no
GEMM finds its weight in L2) multiplied back to back by one ``x [M, K]`` in one graph, replayed
``--iters`` times (CUDA events); µs per GEMM = replay p50 / 20, TB/s = bytes moved (weight +
``x`` + ``y``) / µs. Paths: ``cublas`` (``torch.matmul``), ``skinny`` and ``skinny_pdl``
(:func:`graphrt.kernels.skinny.skinny_linear`, PDL only on SM90+). The floor reads the weight's
bytes at the bandwidth of a 1 GiB D2D copy measured in the same run (``model_steps.weight_floor``).
Every path's 20 outputs are checked against cuBLAS's before the row is kept (``ParityError``
otherwise). ``--sweep`` also times :data:`SWEEP`'s tiles with PDL (rows' ``sweep``, ``best_tile``):
what the GPU's tuning table should hold (``graphrt tune`` picks and writes it; the run uses the
table chosen for this GPU, :mod:`graphrt.kernels.tuning`, and records its name).

On the CPU nothing is timed: shapes shrink :data:`CPU_SHRINK` times, two weights, each path runs
once and is checked (the kernel only under ``TRITON_INTERPRET=1 GRAPHRT_SKINNY_GEMM=interpret``).
Each run writes ``<out>/gemm_<device>_<UTC time>.json``.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

import torch
from rich.table import Table

from graphrt.kernels import skinny, tuning
from graphrt.models.presets import LlamaConfig, preset
from graphrt.tools.bench.gemm_prologue import sweep_prologue
from graphrt.tools.bench.model_steps import weight_floor
from graphrt.tools.bench.model_twin import relative_l2
from graphrt.tools.bench.record import header, percentiles, time_us, write_result
from graphrt.tools.cli.args import resolve_device
from graphrt.tools.cli.console import bench_progress, wide_console

MODELS = ("llama-3.2-1b", "llama-3-8b")
WEIGHTS = {"cuda": 20, "cpu": 2}
CPU_SHRINK = 32
#: Relative L2 error of a path's outputs against cuBLAS's that counts as the same product: bf16
#: rounds each output once after fp32 sums in another order (~2e-3); a wrong tile is ~1.
AGREE = 1e-2
FLOOR_COPY_BYTES = 1 << 30
#: Tiles ``--sweep`` (and ``graphrt tune``) times per M class, around the H100's rule rows.
SWEEP: dict[int, tuple[skinny.Tile, ...]] = {
    1: tuple(skinny.Tile(n, k, w) for n, k, w in [(2, 2048, 4), (4, 2048, 4), (8, 2048, 8), (8, 1024, 4),
                                                  (16, 512, 4), (16, 256, 4), (32, 256, 4)]),
    16: tuple(skinny.Tile(n, k, w, st) for n, k, w, st in [
        (16, 512, 4, 1), (32, 256, 4, 1), (64, 256, 8, 1),  # the register prefetch (earlier best)
        (16, 128, 4, 4), (16, 256, 4, 3), (32, 128, 4, 4), (32, 256, 4, 3),  # Triton's pipeliner
        (64, 128, 4, 4), (64, 128, 8, 3), (128, 64, 4, 4), (128, 128, 8, 3)]),
    64: tuple(skinny.Tile(n, k, w, st) for n, k, w, st in [
        (32, 128, 4, 1), (64, 128, 8, 1), (32, 256, 8, 1),
        (32, 128, 4, 4), (64, 64, 4, 4), (64, 128, 4, 3), (128, 64, 4, 4), (128, 128, 8, 3)]),
}  # fmt: skip
Path = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def projections(cfg: LlamaConfig) -> list[tuple[str, int, int]]:
    """``(name, K, N)`` of every weight a decode step of ``cfg`` multiplies by."""
    h, d = cfg.hidden_size, cfg.head_dim
    return [
        ("qkv", h, (cfg.num_heads + 2 * cfg.num_kv_heads) * d),
        ("o", cfg.num_heads * d, h),
        ("gate_up", h, 2 * cfg.intermediate_size),
        ("down", cfg.intermediate_size, h),
        ("lm_head", h, cfg.vocab_size),
    ]


def paths(device: torch.device) -> dict[str, Path | None]:
    """The compared paths; None where this machine cannot run one."""
    kernel = skinny.enabled(device)
    pdl = kernel and skinny.pdl_default(device)
    return {
        "cublas": lambda x, w: torch.matmul(x, w.t()),
        "skinny": (lambda x, w: skinny.skinny_linear(x, w, pdl=False)) if kernel else None,
        "skinny_pdl": (lambda x, w: skinny.skinny_linear(x, w, pdl=True)) if pdl else None,
    }


def _graph_us(fn: Path, x: torch.Tensor, weights: list[torch.Tensor], iters: int) -> tuple[Any, list]:
    """µs per GEMM (p10/p50/p90) of ``fn(x, w)`` for every weight in one graph, and the outputs
    (None on the CPU: one eager call each)."""
    if not x.is_cuda:
        return None, [fn(x, w) for w in weights]
    stream = torch.cuda.Stream(x.device)
    with torch.cuda.stream(stream):
        fn(x, weights[0])  # NOTE: Triton compiles, cuBLAS picks its kernel outside the capture
    torch.cuda.synchronize(x.device)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        outs = [fn(x, w) for w in weights]
    samples = time_us(graph.replay, iters, x.device)
    return percentiles([s / len(weights) for s in samples]), outs


def _agreement(outs: list[torch.Tensor], ref: list[torch.Tensor], what: str) -> dict[str, float]:
    rel = relative_l2(outs, ref, AGREE, what, "cuBLAS's")
    diff = (torch.stack(outs).float() - torch.stack(ref).float()).abs().max().item()
    return {"rel_l2_vs_cublas": rel, "max_abs_vs_cublas": diff}


def _path_cell(us: Any, nbytes: int) -> dict[str, Any]:
    return {"us": us, "tb_s": nbytes / us["p50"] / 1e6 if us else None}


def measure(run: dict[str, Any], model: str, name: str, k: int, n: int, m: int) -> dict[str, Any]:
    """One row: every path (and with ``--sweep`` every candidate tile) on shape ``[m, k] x [n, k]^T``."""
    device, weights, iters = run["device"], run["weights"], run["iters"]
    gen = torch.Generator(device).manual_seed(m * 7 + n + k)
    x = torch.randn(m, k, device=device, generator=gen).bfloat16()
    w_bytes = n * k * 2
    nbytes = w_bytes + (m * k + m * n) * 2
    row: dict[str, Any] = {"model": model, "proj": name, "m": m, "k": k, "n": n}
    row |= {"weight_bytes": w_bytes, "bytes": nbytes, "paths": {}}
    ref: list[torch.Tensor] = []
    for path, fn in run["paths"].items():
        if fn is None or (path != "cublas" and m > skinny.MAX_M):
            row["paths"][path] = None
            continue
        us, outs = _graph_us(fn, x, weights, iters)
        ref = ref or outs
        cell = _path_cell(us, nbytes) | _agreement(outs, ref, f"{model} {name} M={m} {path}")
        row["paths"][path] = cell | {"tile": None if path == "cublas" else asdict(skinny.tile_for(m, n, k))}
    if run["sweep"] and run["paths"]["skinny_pdl"] is not None:
        row["sweep"] = _sweep(x, weights, ref, iters, nbytes, f"{model} {name} M={m}")
        best = min(row["sweep"], key=lambda c: c["us"]["p50"])
        row["best_tile"] = best["tile"]
        sweep_prologue(row, weights, iters, _graph_us, _agreement, _path_cell)
    floor = run["floor"]
    row["floor_us"] = w_bytes / (floor["bandwidth_gb_s"] * 1e3) if floor else None
    timed = [c["us"]["p50"] for c in row["paths"].values() if c and c["us"]]
    row["best_over_floor"] = min(timed) / row["floor_us"] if timed and row["floor_us"] else None
    return row


def _sweep(x: torch.Tensor, weights: list, ref: list, iters: int, nbytes: int, what: str) -> list[dict]:
    m, k, n = x.shape[0], x.shape[1], weights[0].shape[0]
    tried, out = set(), []
    for tile in SWEEP[skinny.m_class(m)]:
        fit = tile.fit(m, n, k)
        if fit in tried:
            continue
        tried.add(fit)
        us, outs = _graph_us(
            lambda a, w, t=fit: skinny.skinny_linear(a, w, tile=t, pdl=True), x, weights, iters
        )
        out.append({"tile": asdict(fit)} | _path_cell(us, nbytes) | _agreement(outs, ref, f"{what} {fit}"))
    return out


def _shapes(device: torch.device) -> list[tuple[str, str, int, int]]:
    shrink = 1 if device.type == "cuda" else CPU_SHRINK
    out = []
    for model in MODELS:
        cfg = preset(model)
        assert isinstance(cfg, LlamaConfig)
        out += [(model, name, k // shrink, n // shrink) for name, k, n in projections(cfg)]
    return out


def run_bench_gemm(args: argparse.Namespace) -> int:
    """``graphrt bench gemm``: writes a new result file under ``args.out`` and prints its table."""
    start = time.perf_counter()
    device = resolve_device(args.device)
    cuda, table = device.type == "cuda", tuning.install_for(device)
    run = {
        "device": device, "iters": args.iters, "sweep": args.sweep, "paths": paths(device),
        "floor": weight_floor(FLOOR_COPY_BYTES, device, args.iters) if cuda else None,
    }  # fmt: skip
    shapes, sizes, rows = _shapes(device), sorted(set(args.batch_sizes)), []
    with torch.no_grad(), bench_progress() as progress:
        task = progress.add_task("gemm", total=len(shapes) * len(sizes))
        for model, name, k, n in shapes:
            gen = torch.Generator(device).manual_seed(k * 31 + n)
            count = WEIGHTS[device.type]
            run["weights"] = [
                torch.randn(n, k, device=device, generator=gen).bfloat16() * k**-0.5 for _ in range(count)
            ]
            for m in sizes:
                progress.update(task, description=f"{model} {name} M={m}")
                rows.append(measure(run, model, name, k, n, m))
                progress.advance(task)
            del run["weights"]
            if cuda:
                torch.cuda.empty_cache()
    result = {
        **header("gemm_in_graph", args, device),
        "weights_per_graph": WEIGHTS[device.type],
        "shrink": 1 if cuda else CPU_SHRINK,
        "timer": "cuda events, graph replay" if cuda else None,
        "speeds": "measured" if cuda else "not measured on the CPU (shapes shrunk, one eager call)",
        "kernel": {"enabled": run["paths"]["skinny"] is not None, "pdl": run["paths"]["skinny_pdl"] is not None},
        "floor": run["floor"],
        "agree_rel_l2": AGREE,
        "tuning": table.brief(),
        "seconds": time.perf_counter() - start,
        "rows": rows,
    }  # fmt: skip
    out = write_result(result, args.out, f"gemm_{device.type}")
    print_table(result, str(out))
    return 0


def _cell(cell: dict[str, Any] | None) -> str:
    if cell is None:
        return "—"
    if cell["us"] is None:
        return "ok (not timed)"
    return f"{cell['us']['p50']:.1f} ({cell['tb_s']:.2f})"


def _tile(t: dict[str, int] | None) -> str:
    return f"{t['block_n']}x{t['block_k']} w{t['warps']} s{t.get('stages', 1)}" if t else "—"


def _fused_cell(row: dict[str, Any]) -> str:
    """The fused prologue kernel's µs with the model's tile, and the best candidate's."""
    if "prologue" not in row:
        return "—"
    best = min(row["prologue_sweep"], key=lambda c: c["us"]["p50"])
    return f"{row['prologue']['us']['p50']:.1f} → {best['us']['p50']:.1f} {_tile(best['tile'])}"


def print_table(result: dict[str, Any], out: str) -> None:
    """The rows as a rich table: µs per GEMM (TB/s) per path, the floor and the best's ratio to it."""
    table = Table(title=f"GEMM in a CUDA graph, bf16 — {result['env']['device']}")
    cols = ("model", "proj", "M", "MB", "cuBLAS", "skinny", "skinny+PDL", "floor µs", "best × floor")
    sweep = any("best_tile" in r for r in result["rows"])
    for col in (*cols, "best tile", "fused: model tile → best") if sweep else cols:
        table.add_column(col, justify="right", no_wrap=True)
    for r in result["rows"]:
        p = r["paths"]
        cells = [r["model"], r["proj"], str(r["m"]), f"{r['weight_bytes'] / 1e6:.1f}"]
        cells += [_cell(p["cublas"]), _cell(p["skinny"]), _cell(p["skinny_pdl"])]
        cells += [f"{r['floor_us']:.1f}" if r["floor_us"] else "—"]
        cells += [f"{r['best_over_floor']:.2f}x" if r["best_over_floor"] else "—"]
        if sweep:
            cells += [_tile(r.get("best_tile")), _fused_cell(r)]
        table.add_row(*cells)
    floor, agree = result["floor"], f"outputs agree with torch.matmul's (rel L2 ≤ {result['agree_rel_l2']:g})"
    if floor is None:
        table.caption = (
            f"CPU: speeds not measured; shapes shrunk {result['shrink']}x, one eager call per path; "
            f"{agree}; the kernel runs on CUDA, or here under TRITON_INTERPRET=1 {skinny.ENV}=interpret"
        )
    else:
        table.caption = (
            f"µs per GEMM (TB/s: weight + x + y bytes), p50 of {result['args']['iters']} replays of "
            f"{result['weights_per_graph']} GEMMs; cuBLAS: torch.matmul; floor: weight bytes at "
            f"{floor['bandwidth_gb_s']:.0f} GB/s (1 GiB copy); {agree}"
        )
    console = wide_console()
    console.print(table)
    console.print(f"{result['seconds']:.0f} s in all; written to {out}")
