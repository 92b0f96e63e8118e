"""``graphrt bench sampler``: the in-graph sampler's time per step, torch vs the fused kernel vs floors.

For each (batch size, vocabulary, kind of rows: greedy, ``top_p=0.9``, ``top_k=50``) every path
is captured in a CUDA graph of ``REPS`` calls on the same bf16 logits (an LLM-like Zipf tail,
exponent 1.5, in random order) and replayed ``--iters`` times; µs per call. Paths: ``torch``
(:func:`sample_torch`: a stable sort of the vocabulary per row, what ``GRAPHRT_FUSED_SAMPLER=0``
runs), ``fused`` (the two Triton launches; ``fused_no_pdl``: the second one without
programmatic dependent launch), and two floors: ``argmax`` (one torch argmax of the logits, the
least a greedy step does) and ``launch`` (a one-element fill: one kernel node). The fused and
torch tokens are compared; a difference fails the run (exit 1). Target: fused ≤ 15 µs at bs 1.
On the CPU the torch sampler runs once per case (tokens only): speeds are not measured.

Then the sampler's extras (log-probabilities, penalties, token masks), torch against the fused
kernels (:mod:`.sampler_extras`), per (batch size, vocabulary).

``--sweep`` (CUDA) also times the fused kernels' layouts at bs 1 (:mod:`.sampler_sweep`).

Usage: ``graphrt bench sampler [--batch-sizes 1,8,64] [--vocabs 49152,128256] [--sweep] [--device cuda]``
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from rich.table import Table

from graphrt import SamplingParams
from graphrt.metadata.sampling import SamplingBuffers, sampling_inputs
from graphrt.runtime.sampler.draw import fused_sampler, sample_torch
from graphrt.runtime.sampler.launch import fused_sample
from graphrt.tools.bench.record import header, percentiles, time_us, write_result
from graphrt.tools.bench.sampler_extras import extras_table, measure_extras
from graphrt.tools.bench.sampler_sweep import best_layouts, sweep_layouts, sweep_table
from graphrt.tools.cli.args import resolve_device
from graphrt.tools.cli.console import bench_progress, wide_console

KINDS = {
    "greedy": SamplingParams(),
    "top_p=0.9": SamplingParams(temperature=1.0, top_p=0.9, seed=1),
    "top_k=50": SamplingParams(temperature=1.0, top_k=50, seed=1),
}
#: Sampler calls per captured graph (a replay's launch cost spread over them).
REPS = 20
#: The fused sampler's target at batch size 1 (graphrt issue 25), µs.
TARGET_US = 15.0
ZIPF = 1.5


def zipf_logits(rows: int, vocab: int, device: torch.device, seed: int = 0) -> torch.Tensor:
    """``[rows, vocab]`` bf16: ``-ZIPF * log(rank)`` plus a little noise, ranks in random order."""
    gen = torch.Generator().manual_seed(seed)
    ranks = torch.argsort(torch.rand(rows, vocab, generator=gen), dim=-1).float() + 1
    logits = 10 - ZIPF * torch.log(ranks) + 0.05 * torch.randn(rows, vocab, generator=gen)
    return logits.to(device, torch.bfloat16)


def _graph_us(fn: Callable[[], Any], iters: int, stream: torch.cuda.Stream) -> dict[str, float]:
    """µs per ``fn()`` call: ``REPS`` calls captured in one graph (warm-up on its stream), replayed."""
    device = stream.device
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.synchronize(device)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        for _ in range(REPS):
            fn()
    return percentiles([us / REPS for us in time_us(graph.replay, iters, device)])


def _paths(logits: torch.Tensor, params: SamplingBuffers) -> dict[str, Callable[[], Any]]:
    one = torch.zeros(1, device=logits.device)
    return {
        "torch": lambda: sample_torch(logits, params),
        "fused": lambda: fused_sample(logits, params),
        "fused_no_pdl": lambda: fused_sample(logits, params, pdl=False),
        "argmax": lambda: logits.argmax(dim=-1),
        "launch": lambda: one.fill_(1.0),
    }


def measure(bs: int, vocab: int, kind: str, iters: int, device: torch.device) -> dict[str, Any]:
    """One case: tokens compared (CUDA: fused vs torch) and, on CUDA, µs per call of every path."""
    logits = zipf_logits(bs, vocab, device, seed=bs * 7 + vocab)
    params = sampling_inputs([KINDS[kind]] * bs, np.arange(bs) * 13 + 5, device)
    torch_tokens = sample_torch(logits, params)
    row: dict[str, Any] = {"bs": bs, "vocab": vocab, "rows": kind}
    if device.type != "cuda":
        return {**row, "tokens_equal": None, "us": None}
    fused_tokens = fused_sample(logits, params)
    row["tokens_equal"] = bool(torch.equal(fused_tokens, torch_tokens))
    row["rows_differing"] = int((fused_tokens != torch_tokens).sum().item())
    stream = torch.cuda.Stream(device)  # NOTE: one capture stream: the fused paths share a workspace
    row["us"] = {name: _graph_us(fn, iters, stream) for name, fn in _paths(logits, params).items()}
    p50 = {name: stats["p50"] for name, stats in row["us"].items()}
    row["fused_speedup_vs_torch"] = p50["torch"] / p50["fused"]
    row["fused_over_argmax"] = p50["fused"] / p50["argmax"]
    if bs == 1:
        row["meets_target"] = p50["fused"] <= TARGET_US
    return row


def run_bench_sampler(args: argparse.Namespace) -> int:
    """``graphrt bench sampler``: every (bs, vocabulary, kind of rows) case; JSON + table."""
    device = resolve_device(args.device)
    cases = [(bs, v, kind) for v in args.vocabs for bs in args.batch_sizes for kind in KINDS]
    rows = []
    with bench_progress() as progress:
        task = progress.add_task("", total=len(cases))
        for bs, vocab, kind in cases:
            progress.update(task, description=f"vocab {vocab} bs={bs} {kind}")
            rows.append(measure(bs, vocab, kind, args.iters, device))
            progress.advance(task)
    # NOTE: the fused extras need CUDA (or the interpreter's switch, as the tests set it)
    cases = [(bs, v) for v in args.vocabs for bs in args.batch_sizes] if fused_sampler(device) else []
    extras = [_extras(bs, vocab, args.iters, device) for bs, vocab in cases]
    sweep = None
    if args.sweep and device.type == "cuda":
        stream = torch.cuda.Stream(device)
        sweep = sweep_layouts(
            args.vocabs, KINDS, lambda bs, v: zipf_logits(bs, v, device, seed=bs * 7 + v),
            lambda fn: _graph_us(fn, args.iters, stream),
        )  # fmt: skip
    result = {
        **header("sampler", args, device),
        "logits": f"bf16, -{ZIPF} * log(rank) + N(0, 0.05), ranks in random order",
        "reps_per_graph": REPS,
        "target_us_bs1": TARGET_US,
        "speeds_measured": device.type == "cuda",
        "rows": rows,
        "extras": extras,
        "sweep": sweep,
        "best_layouts": None if sweep is None else best_layouts(sweep),
    }
    out = write_result(result, args.out, f"sampler_{device.type}")
    if sweep is not None:
        wide_console().print(sweep_table(sweep, list(KINDS)))
    _print(result, out)
    if device.type == "cuda":
        wide_console().print(extras_table(extras))
    same = all(r["tokens_equal"] is not False for r in rows + (sweep or []))
    return 0 if same and all(r["ok"] for r in extras) else 1


def _extras(bs: int, vocab: int, iters: int, device: torch.device) -> dict[str, Any]:
    """:func:`measure_extras` on this bench's logits; timed on CUDA (its own capture stream)."""
    logits = zipf_logits(bs, vocab, device, seed=bs * 7 + vocab)
    if device.type != "cuda":
        return measure_extras(logits, None)
    stream = torch.cuda.Stream(device)
    return measure_extras(logits, lambda fn: _graph_us(fn, iters, stream))


def _cell(row: dict[str, Any], name: str) -> str:
    return "-" if row["us"] is None else f"{row['us'][name]['p50']:.1f}"


def _print(result: dict[str, Any], out: Path) -> None:
    table = Table(title=f"sampler µs per call in a CUDA graph (p50, {REPS} calls per graph)")
    paths = ("torch", "fused", "fused_no_pdl", "argmax", "launch")
    columns = (
        "bs",
        "vocab",
        "rows",
        "torch",
        "fused",
        "no PDL",
        "argmax",
        "launch",
        "torch/fused",
        "tokens",
    )
    for col in columns:
        table.add_column(col, justify="left" if col == "rows" else "right")
    for row in result["rows"]:
        speedup = row.get("fused_speedup_vs_torch")
        same = {True: "same", False: f"{row.get('rows_differing')} differ", None: "-"}[row["tokens_equal"]]
        table.add_row(
            str(row["bs"]),
            str(row["vocab"]),
            row["rows"],
            *(_cell(row, name) for name in paths),
            "-" if speedup is None else f"{speedup:.1f}x",
            same,
        )
    if not result["speeds_measured"]:
        table.caption = "CPU: speeds are not measured (the torch sampler ran once per case); run on CUDA"
    else:
        table.caption = f"target: fused ≤ {TARGET_US:.0f} µs at bs 1; floors: argmax, one-kernel launch"
    console = wide_console()
    console.print(table)
    console.print(f"written to {out}")
