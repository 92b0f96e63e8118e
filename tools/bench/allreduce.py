"""All-reduce inside a CUDA graph: NCCL vs the one-shot symmetric-memory path, per message size.

Run on every rank: ``torchrun --nproc-per-node 2 -m graphrt.tools.bench.allreduce``. Each path
is captured as a graph of ``--per-graph`` all-reduces (the per-layer pattern), replayed
``--iters`` times; the result of a replay with fresh inputs is checked against the exact sum
and compared bit for bit across ranks. JSON: ``bench/results/allreduce_tp<N>.json`` (rank 0).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
from pathlib import Path

import torch
import torch.distributed as dist

from graphrt.parallel import init_tp, shutdown
from graphrt.parallel.ops import communicator
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


def bench_size(nbytes: int, per_graph: int, iters: int, rank: int, world: int, device: torch.device) -> dict:
    comm = communicator(f"tp{world}_cuda")
    numel = nbytes // 2
    paths = {"nccl": lambda x: dist.all_reduce(x, group=comm.group.device_group)}
    if comm.oneshot is not None and comm.oneshot.max_bytes >= nbytes:
        paths["oneshot"] = comm.oneshot.all_reduce_
    row: dict = {"bytes": nbytes, "dtype": "bfloat16", "per_graph": per_graph}
    stream = torch.cuda.Stream(device)
    for name, fn in paths.items():
        xs = [torch.zeros(numel, dtype=torch.bfloat16, device=device) for _ in range(per_graph)]
        graph = _graph(fn, xs, stream)
        gen = torch.Generator(device=device).manual_seed(1000 + rank)
        for x in xs:
            x.copy_(torch.randn(numel, generator=gen, device=device).bfloat16())
        inputs = [x.clone() for x in xs]
        graph.replay()
        torch.cuda.synchronize()
        want = [i.float() for i in inputs]
        for w in want:
            dist.all_reduce(w, group=comm.group.device_group)  # fp32 reference sum
        close = max((x.float() - w).abs().max().item() for x, w in zip(xs, want, strict=True))
        everyone = [torch.empty_like(xs[0]) for _ in range(world)]
        dist.all_gather(everyone, xs[0], group=comm.group.device_group)
        identical = all(torch.equal(e, everyone[0]) for e in everyone)
        us = _time_replay(graph, iters) / per_graph
        row[name] = {
            "us_per_allreduce": us,
            "max_abs_err_vs_fp32_sum": close,
            "bit_identical_across_ranks": identical,
        }
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", default="2048,8192,32768,131072,262144", help="message bytes")
    parser.add_argument("--per-graph", type=int, default=32)
    parser.add_argument("--iters", type=int, default=200)
    parser.add_argument("--out", default="bench/results")
    args = parser.parse_args(argv)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    os.environ.setdefault("GRAPHRT_ALLREDUCE", "oneshot")  # NOTE: both paths, or an error
    group = init_tp(world, torch.device("cuda"))
    rows = [
        bench_size(int(s), args.per_graph, args.iters, group.rank, world, group.device)
        for s in args.sizes.split(",")
    ]
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
        for r in rows:
            print(r["bytes"], {k: v for k, v in r.items() if isinstance(v, dict)})
        print(f"written to {out}")
    shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
