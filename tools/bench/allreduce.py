"""All-reduce inside a CUDA graph, per message size: NCCL, torch's one-shot over symmetric memory
(``GRAPHRT_ALLREDUCE=oneshot``: a copy, then ``one_shot_all_reduce_out``) and ours (``p2p``: one
Triton kernel, :mod:`graphrt.parallel.p2p`).

Run on every rank: ``torchrun --nproc-per-node 2 -m graphrt.tools.bench.allreduce``. Each path
is captured as a graph of ``--per-graph`` all-reduces (the per-layer pattern), replayed
``--iters`` times; the result of a replay with fresh inputs is checked against every rank's
inputs summed in rank order (fp32, rounded once: exact for all three at two ranks) and
compared bit for bit across ranks. JSON: ``bench/results/allreduce_tp<N>.json`` (rank 0).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
from collections.abc import Callable
from functools import partial
from pathlib import Path

import torch
import torch.distributed as dist

from graphrt.parallel import TPGroup, init_tp, shutdown
from graphrt.parallel.p2p import ALIGN, PeerSum, reference_sum
from graphrt.parallel.symm import OneShot
from graphrt.tools.cli.env import environment


def _graph(fn, xs: list[torch.Tensor], stream: torch.cuda.Stream) -> torch.cuda.CUDAGraph:
    with torch.cuda.stream(stream):
        for x in xs:  # NOTE: eager warm-up: connections set up outside the capture
            fn(x)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        for x in xs:
            fn(x)
    return graph


def _time_replay(graph: torch.cuda.CUDAGraph, iters: int) -> float:
    samples = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) * 1e3)
    return statistics.median(samples)


def _check(xs: list[torch.Tensor], inputs: list[torch.Tensor], group: TPGroup) -> dict:
    """Each sum against every rank's inputs added in rank order: exact (bf16 of the fp32 sum, as
    :func:`reference_sum`), its distance to the fp32 sum, and the same bits on every rank."""
    exact, err, identical = True, 0.0, True
    for x, inp in zip(xs, inputs, strict=True):
        parts = [torch.empty_like(inp) for _ in range(group.size)]
        dist.all_gather(parts, inp, group=group.device_group)
        want = reference_sum(parts)
        exact &= bool(torch.equal(x, want))
        err = max(err, (x.float() - reference_sum([p.float() for p in parts])).abs().max().item())
        outs = [torch.empty_like(x) for _ in range(group.size)]
        dist.all_gather(outs, x, group=group.device_group)
        identical &= all(torch.equal(o, outs[0]) for o in outs)
    return {
        "equals_rank_order_sum": exact,
        "max_abs_err_vs_fp32_sum": err,
        "bit_identical_across_ranks": identical,
    }


def bench_size(nbytes: int, paths: dict[str, Callable], per_graph: int, iters: int, group: TPGroup) -> dict:
    """One row: each path's µs per sum in a graph of ``per_graph`` sums of ``nbytes`` bf16, checked."""
    numel, device = nbytes // 2, group.device
    row: dict = {"bytes": nbytes, "dtype": "bfloat16", "per_graph": per_graph}
    stream = torch.cuda.Stream(device)
    for name, fn in paths.items():
        xs = [torch.zeros(numel, dtype=torch.bfloat16, device=device) for _ in range(per_graph)]
        graph = _graph(fn, xs, stream)
        gen = torch.Generator(device=device).manual_seed(1000 + group.rank)
        for x in xs:
            x.copy_(torch.randn(numel, generator=gen, device=device).bfloat16())
        inputs = [x.clone() for x in xs]
        graph.replay()
        torch.cuda.synchronize()
        # NOTE: checked before the timing: every timed replay sums the sums again (in place)
        checked = _check(xs, inputs, group)
        row[name] = {"us_per_allreduce": _time_replay(graph, iters) / per_graph, **checked}
    return row


def _paths(group: TPGroup, max_bytes: int) -> dict[str, Callable]:
    """NCCL, torch's one-shot (copy + ``one_shot_all_reduce_out``) and ours (one kernel), each
    set up for messages up to ``max_bytes`` whatever ``GRAPHRT_ALLREDUCE`` says."""
    oneshot = OneShot.create(group, max_bytes, required=True)
    p2p = PeerSum.create(group, -(-max_bytes // ALIGN) * ALIGN)
    nccl = partial(dist.all_reduce, group=group.device_group)
    return {"nccl": nccl, "oneshot": oneshot.all_reduce_, "p2p": p2p.all_reduce_}  # type: ignore[union-attr]


def _table(rows: list[dict]) -> str:
    names = [k for k, v in rows[0].items() if isinstance(v, dict)]
    lines = [
        "| bytes | " + " | ".join(f"{n} µs" for n in names) + " | all exact |",
        "|---" * (len(names) + 2) + "|",
    ]
    for r in rows:
        exact = all(r[n]["equals_rank_order_sum"] and r[n]["bit_identical_across_ranks"] for n in names)
        lines.append(
            f"| {r['bytes']} | "
            + " | ".join(f"{r[n]['us_per_allreduce']:.2f}" for n in names)
            + f" | {exact} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", default="2048,8192,32768,131072,262144", help="message bytes")
    parser.add_argument("--per-graph", type=int, default=32)
    parser.add_argument("--iters", type=int, default=200)
    parser.add_argument("--out", default="bench/results")
    args = parser.parse_args(argv)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    group = init_tp(world, torch.device("cuda"))
    sizes = [int(s) for s in args.sizes.split(",")]
    paths = _paths(group, max(sizes))
    rows = [bench_size(n, paths, args.per_graph, args.iters, group) for n in sizes]
    if group.rank == 0:
        result = {
            "bench": "allreduce_in_graph",
            "world": world,
            "env": environment(group.device),
            "nccl_nvls_enable": os.environ.get("NCCL_NVLS_ENABLE"),
            "symm_mem_disable_multicast": os.environ.get("TORCH_SYMM_MEM_DISABLE_MULTICAST"),
            "rows": rows,
        }
        out = Path(args.out) / f"allreduce_tp{world}.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=2) + "\n")
        print(_table(rows))
        print(f"written to {out}")
    shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
