"""``graphrt bench moe``: one MoE layer's routed experts inside a CUDA graph, the fused Triton
kernels against the torch reference, at the weight-read floor of the experts the step routes to.

Shapes (:data:`SHAPES`): Qwen3-30B-A3B, gpt-oss-20b, DeepSeek-V2-Lite experts, bf16 random
weights; ``--batch-sizes`` token rows (default 1, 16, 64), ``k`` distinct random experts per
row; one more row per shape at 16 rows of which 9 are requests and 7 pad rows (id ``E``): its
bytes are the 9 requests' experts only. :data:`LAYERS` layers (own weights and routing) run back
to back in one graph so a replay never finds its experts in L2; µs per layer = replay p50 /
layers. Bytes = the distinct experts routed to (``w13``, ``w2``, biases) + ``x`` and the output;
GB/s = bytes / µs, against the bandwidth of a 1 GiB D2D copy measured in the same run
(``floor_us`` = bytes at that bandwidth). Paths: ``triton``
(:func:`graphrt.kernels.moe.fused_experts`; ``triton_skinny`` / ``triton_grouped``: one kernel
path forced, to place ``GRAPHRT_MOE_SKINNY_SLOTS``), ``reference``
(:func:`graphrt.kernels.moe.experts_reference`); the alignment alone: ``align``
(ours) and ``sgl_align`` (sgl-kernel's ``moe_align_block_size``, when it imports). Every path's
output is checked against the reference first (:class:`ParityError`).

On the CPU nothing is timed: shapes shrink :data:`CPU_SHRINK` times, one eager call per path.
Each run writes ``<out>/moe_<device>_<UTC time>.json``.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

import torch
from rich.table import Table

from graphrt.kernels.moe import (
    BLOCK_M,
    ExpertWeights,
    Routing,
    experts_reference,
    fused_experts,
    new_routing,
    triton_experts,
)
from graphrt.kernels.moe import align as moe_align
from graphrt.tools.bench.model_steps import weight_floor
from graphrt.tools.bench.model_twin import relative_l2
from graphrt.tools.bench.record import header, percentiles, time_us, write_result
from graphrt.tools.cli.args import resolve_device
from graphrt.tools.cli.console import bench_progress, wide_console

#: ``(E, k, H, I, activation, biases)`` of one layer's experts.
Shape = tuple[int, int, int, int, str, bool]
#: ``name: (E, k, H, I, activation, biases)``; DeepSeek's two shared experts are fused in (64 routed
#: experts + 2, top-6 + 2 slots), as the model runs them (:attr:`MoESpec.shared_slots`).
SHAPES: dict[str, Shape] = {
    "qwen3-30b-a3b": (128, 8, 2048, 768, "silu", False),
    "gpt-oss-20b": (32, 4, 2880, 2880, "swiglu_clamp", True),
    "deepseek-v2-lite": (66, 8, 2048, 1408, "silu", False),
}
LAYERS = {"cuda": 2, "cpu": 1}
CPU_SHRINK = 32
#: Relative L2 error against the reference that counts as the same layer (bf16 rounding ~4e-3).
AGREE = 1e-2
FLOOR_COPY_BYTES = 1 << 30
#: The padded bucket: ``(rows, requests)``.
PADDED = (16, 9)
Layer = tuple[torch.Tensor, ExpertWeights, Routing]


def _layer(name: str, rows: int, real: int, device: torch.device, seed: int, shrink: int) -> Layer:
    return layer(SHAPES[name], rows, real, device, seed, shrink)


def layer(shape: Shape, rows: int, real: int, device: torch.device, seed: int, shrink: int) -> Layer:
    """One MoE layer's experts of ``shape`` (``H`` and ``I`` divided by ``shrink``; bf16 random
    weights from ``seed``), ``rows`` token rows of which the first ``real`` route to ``k``
    distinct random experts and the rest are pad rows (id ``E``): ``(x, weights, routing)``."""
    experts, topk, hidden, inter, act, bias = shape
    hidden, inter = hidden // shrink, inter // shrink
    gen = torch.Generator(device).manual_seed(seed)

    def rand(*shape: int, scale: float) -> torch.Tensor:
        return (torch.randn(shape, device=device, generator=gen) * scale).bfloat16()

    w = ExpertWeights(
        rand(experts, 2 * inter, hidden, scale=hidden**-0.5), rand(experts, hidden, inter, scale=inter**-0.5),
        rand(experts, 2 * inter, scale=0.5) if bias else None, rand(experts, hidden, scale=0.5) if bias else None, act,
    )  # fmt: skip
    scores = torch.rand(rows, experts, device=device, generator=gen)
    ids = scores.topk(topk, dim=1).indices.int()
    ids[real:] = experts  # NOTE: pad rows route to no expert
    weights = torch.rand(rows, topk, device=device, generator=gen)
    return rand(rows, hidden, scale=1.0), w, new_routing(ids.contiguous(), weights, experts)


def routed_bytes(layer: Layer) -> tuple[int, int]:
    """``(distinct experts routed to, bytes a step must read)``: those experts' weights and
    biases, ``x`` and the output (host-side count, outside any graph)."""
    x, w, routing = layer
    distinct = int(torch.unique(routing.topk_ids[routing.topk_ids < w.num_experts]).numel())
    per_expert = sum(t[0].numel() * t.element_size() for t in (w.w13, w.w2, w.b13, w.b2) if t is not None)
    return distinct, distinct * per_expert + 2 * x.numel() * x.element_size()


def paths() -> dict[str, Callable[[Layer], torch.Tensor] | None]:
    """The timed paths (None where this machine cannot run one)."""
    try:
        import sgl_kernel
    except ImportError:
        sgl_kernel = None
    return {
        "reference": (lambda lay: experts_reference(lay[0], lay[1], lay[2].topk_ids, lay[2].topk_weights)),
        "triton": (lambda lay: fused_experts(*lay)),
        "triton_skinny": forced_path(1 << 30),
        "triton_grouped": forced_path(0),
        "align": (lambda lay: moe_align.moe_align(lay[2].topk_ids, lay[1].num_experts, lay[2])),
        "sgl_align": _sgl_align(sgl_kernel) if sgl_kernel is not None else None,
    }


def forced_path(slots: int) -> Callable[[Layer], torch.Tensor]:
    """The Triton path with the skinny kernels up to ``slots`` token slots (0: always grouped)."""

    def run(layer: Layer) -> torch.Tensor:
        return triton_experts.fused_experts_triton(*layer, skinny_slots=slots)

    return run


def _sgl_align(sgl: Any) -> Callable[[Layer], None]:
    """sgl-kernel's alignment over ``E + 1`` experts (pad rows as one more expert), into buffers
    sized for that (allocated per call: the capture keeps them; the sentinel fill, as sglang
    does it, is part of the timed work)."""

    def run(layer: Layer) -> None:
        ids, experts = layer[2].topk_ids, layer[1].num_experts
        bound = ids.numel() + (experts + 1) * (BLOCK_M - 1)
        new = lambda n: torch.empty(n, dtype=torch.int32, device=ids.device)  # noqa: E731
        sorted_ids = torch.full((bound,), ids.numel(), dtype=torch.int32, device=ids.device)
        cumsum = torch.zeros(experts + 2, dtype=torch.int32, device=ids.device)
        sgl.moe_align_block_size(
            ids, experts + 1, BLOCK_M, sorted_ids, new(-(-bound // BLOCK_M)), new(1), cumsum
        )

    return run


def time_layers(fn: Callable[[Layer], Any], layers: list[Layer], iters: int) -> tuple[Any, list]:
    """µs per layer (p10/p50/p90) of ``fn`` over every layer in one graph, and the outputs
    (the CPU: one eager call each, not timed)."""
    if layers[0][0].device.type != "cuda":
        return None, [fn(lay) for lay in layers]
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        [fn(lay) for lay in layers]  # NOTE: Triton compiles outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        outs = [fn(lay) for lay in layers]
    samples = time_us(graph.replay, iters, layers[0][0].device)
    return percentiles([s / len(layers) for s in samples]), outs


def measure(run: dict[str, Any], name: str, rows: int, real: int) -> dict[str, Any]:
    """One row: every path on ``LAYERS`` layers of shape ``name`` at ``rows`` tokens (``real`` requests)."""
    device, shrink = run["device"], run["shrink"]
    layers = [_layer(name, rows, real, device, 1000 * i + rows, shrink) for i in range(LAYERS[device.type])]
    counts = [routed_bytes(lay) for lay in layers]
    nbytes = sum(b for _, b in counts) // len(counts)
    row: dict[str, Any] = {"shape": name, "tokens": rows, "requests": real, "bytes": nbytes}
    row |= {"distinct_experts": [d for d, _ in counts], "paths": {}}
    ref: list[torch.Tensor] = []
    for path, fn in run["paths"].items():
        if fn is None:
            row["paths"][path] = None
            continue
        us, outs = time_layers(fn, layers, run["iters"])
        cell: dict[str, Any] = {
            "us": us,
            "gb_s": nbytes / us["p50"] / 1e3 if us and "align" not in path else None,
        }
        if not path.endswith("align"):  # NOTE: the reference runs first
            ref = ref or outs
            cell |= agreement(outs, ref, f"{name} T={rows} {path}")
        row["paths"][path] = cell
    floor = run["floor"]
    row["floor_us"] = nbytes / (floor["bandwidth_gb_s"] * 1e3) if floor else None
    t = row["paths"]["triton"]["us"]
    row["triton_over_floor"] = t["p50"] / row["floor_us"] if t and row["floor_us"] else None
    return row


def agreement(outs: list[torch.Tensor], ref: list[torch.Tensor], what: str) -> dict[str, float]:
    return {"rel_l2_vs_reference": relative_l2(outs, ref, AGREE, what)}


def run_bench_moe(args: argparse.Namespace) -> int:
    """``graphrt bench moe``: writes a new result file under ``args.out`` and prints its table."""
    start = time.perf_counter()
    device = resolve_device(args.device)
    cuda = device.type == "cuda"
    run = {
        "device": device, "iters": args.iters, "paths": paths(), "shrink": 1 if cuda else CPU_SHRINK,
        "floor": weight_floor(FLOOR_COPY_BYTES, device, args.iters) if cuda else None,
    }  # fmt: skip
    cases = [(n, m, m) for n in SHAPES for m in sorted(set(args.batch_sizes))] + [
        (n, *PADDED) for n in SHAPES
    ]
    rows = []
    with torch.no_grad(), bench_progress() as progress:
        task = progress.add_task("moe", total=len(cases))
        for name, tokens, real in cases:
            progress.update(task, description=f"{name} T={tokens} ({real} requests)")
            rows.append(measure(run, name, tokens, real))
            progress.advance(task)
            if cuda:
                torch.cuda.empty_cache()
    result = {
        **header("moe_experts_in_graph", args, device),
        "layers_per_graph": LAYERS[device.type], "shrink": run["shrink"], "block_m": BLOCK_M,
        "timer": "cuda events, graph replay" if cuda else None,
        "speeds": "measured" if cuda else "not measured on the CPU (shapes shrunk, one eager call)",
        "kernel": {"enabled": triton_experts.enabled(device), "skinny_max_slots": triton_experts.max_skinny_slots()},
        "floor": run["floor"], "agree_rel_l2": AGREE, "seconds": time.perf_counter() - start, "rows": rows,
    }  # fmt: skip
    out = write_result(result, args.out, f"moe_{device.type}")
    print_table(result, str(out))
    return 0


def _us(cell: dict[str, Any] | None) -> str:
    if cell is None:
        return "—"
    if cell["us"] is None:
        return "ok (not timed)"
    rate = f" ({cell['gb_s']:.0f} GB/s)" if cell.get("gb_s") else ""
    return f"{cell['us']['p50']:.1f}{rate}"


def print_table(result: dict[str, Any], out: str) -> None:
    """µs per layer (GB/s) per path, the routed experts, the floor and Triton's ratio to it."""
    table = Table(title=f"MoE experts in a CUDA graph, bf16 — {result['env']['device']}")
    cols = (
        "shape",
        "T",
        "req",
        "experts",
        "MB",
        "triton",
        "reference",
        "align",
        "sgl align",
        "floor µs",
        "× floor",
    )
    for col in cols:
        table.add_column(col, justify="right", no_wrap=True)
    for r in result["rows"]:
        p = r["paths"]
        floor, ratio = r["floor_us"], r["triton_over_floor"]
        table.add_row(
            r["shape"], str(r["tokens"]), str(r["requests"]), "/".join(map(str, r["distinct_experts"])),
            f"{r['bytes'] / 1e6:.1f}", _us(p["triton"]), _us(p["triton_skinny"]), _us(p["triton_grouped"]),
            _us(p["reference"]), _us(p["align"]), _us(p["sgl_align"]),
            f"{floor:.1f}" if floor else "—", f"{ratio:.2f}" if ratio else "—",
        )  # fmt: skip
    console = wide_console()
    console.print(table)
    console.print(f"wrote {out}")
