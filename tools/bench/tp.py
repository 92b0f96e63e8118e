"""Decode step time at TP=1 vs TP=N: the Llama-3-8B shape with random bf16 weights, graphed and eager.

``python -m graphrt.tools.bench.tp --tp 1`` and ``torchrun --nproc-per-node 2 -m
graphrt.tools.bench.tp --tp 2``. Every rank runs every step (rank 0's batch, broadcast); times
are rank 0's, per-rank host time of a graphed step is reported for every rank, and the decode
graph's kernel list gives the all-reduce count. JSON: ``bench/results/decode_tp<N>_<device>.json``.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from pathlib import Path
from statistics import median
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from graphrt import Batch, ForwardMode, GraphRuntime, KVShape, PagedKVCache, ReqToToken, RuntimeConfig
from graphrt.models.llama import TinyLlama
from graphrt.models.presets import PRESETS, LlamaConfig
from graphrt.parallel import Message, Op, StepChannel, TPGroup, init_tp, pack, shutdown
from graphrt.runtime import TPRuntime
from graphrt.tools.bench.decode import PAGE_SIZE, decode_batch, prefill_batch, time_us
from graphrt.tools.bench.device_ops import profile_steps
from graphrt.tools.cli.env import environment

LLAMA3_8B = PRESETS["llama-3-8b"]  # NOTE: one definition of the shape, the presets'
COLLECTIVE_KERNELS = ("nccl", "allreduce", "all_reduce", "one_shot", "allgather")


def random_model(cfg: LlamaConfig, tp: TPGroup, device: torch.device) -> TinyLlama:
    """This rank's shards, filled on the device (std 1/sqrt(fan_in)); not TP-invariant weights."""
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device(device):
            model = TinyLlama(cfg, tp)
    finally:
        torch.set_default_dtype(default)
    gen = torch.Generator(device=device).manual_seed(tp.rank)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.fill_(1.0)
                continue
            fan_in = 1 if "embed" in name else p.full_shape[-1]
            p.normal_(0.0, fan_in**-0.5, generator=gen)
    model.inv_freq = model.inv_freq.float()
    return model.eval()


def _runtime(
    tp: TPGroup, device: torch.device, max_bs: int, context: int, backend: str | None
) -> GraphRuntime:
    config = RuntimeConfig(
        max_batch_size=max_bs,
        max_context_len=context + 64,
        page_size=PAGE_SIZE,
        backend=backend,
        record_kernels=True,  # NOTE: collectives_per_graph reads each graph's kernel list
    )
    model = random_model(LLAMA3_8B, tp, device)
    pages = max_bs * config.max_pages + 1
    kv = PagedKVCache(KVShape(32, model.num_kv_heads, 128, PAGE_SIZE, pages), torch.bfloat16, device)
    r2t = ReqToToken(max_bs, config.max_context_len, PAGE_SIZE, kv.dummy_slot, device)
    runtime = GraphRuntime(model, kv, r2t, config, vocab_size=LLAMA3_8B.vocab_size)
    return TPRuntime(runtime, StepChannel(tp)) if tp.size > 1 else runtime  # type: ignore[return-value]


def collectives_per_graph(runtime: GraphRuntime, bucket: int) -> dict[str, int]:
    graph = runtime.dispatcher.graphs[(ForwardMode.DECODE, bucket)]
    found: dict[str, int] = {}
    for k in graph.info.kernels:
        if any(tag in k.name.lower() for tag in COLLECTIVE_KERNELS):
            found[k.name] = found.get(k.name, 0) + k.count
    return found


def channel_us(tp: TPGroup, batch: Batch, iters: int = 300) -> dict[str, float]:
    """µs per step message on the last rank, ``iters`` back to back: the shared-memory ring vs one
    gloo broadcast, the same message; raises if a rank received anything else."""
    msg = Message(Op.RUN, 0, False, batch)
    want = pack(msg)
    found = {}
    for name, use_ring in (("ring", True), ("gloo", False)):
        channel = StepChannel(tp, use_ring=use_ring)
        if use_ring and channel.ring is None:
            continue
        tp.barrier()
        start = time.perf_counter()
        for _ in range(iters):
            got = channel.exchange(msg if tp.is_driver else None)
        found[name] = (time.perf_counter() - start) / iters * 1e6
        if not np.array_equal(pack(got), want):
            raise RuntimeError(f"rank {tp.rank}: the {name} channel delivered another step")
    box = [found]
    dist.broadcast_object_list(box, src=tp.size - 1, group=tp.cpu_group)
    return box[0]


def collective_share(step: Callable[[], object], device: torch.device, steps: int = 5) -> dict:
    """Device µs per step of the collective kernels (profiled replays) and their share of busy time."""
    profile = profile_steps(step, device, steps, top=1000)
    if profile["busy_us"] is None:
        return {"busy_us": None, "collective_us": None, "collective_share": None}
    mine = [k for k in profile["kernels"] if any(t in k["kernel"].lower() for t in COLLECTIVE_KERNELS)]
    us = sum(k["us"] for k in mine)
    return {
        "busy_us": profile["busy_us"],
        "span_us": profile["span_us"],
        "collective_us": us,
        "collective_launches": sum(k["launches"] for k in mine),
        "collective_share": us / profile["busy_us"],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tp", type=int, default=1)
    parser.add_argument("--batch-sizes", default="1,16,64")
    parser.add_argument("--context", type=int, default=512)
    parser.add_argument("--iters", type=int, default=30)
    parser.add_argument("--backend", default=None)
    parser.add_argument("--out", default="bench/results")
    args = parser.parse_args(argv)
    tp = init_tp(args.tp, torch.device("cuda"))
    device = tp.device
    sizes = [int(s) for s in args.batch_sizes.split(",")]
    runtime = _runtime(tp, device, max(sizes), args.context, args.backend)
    report = runtime.capture(show_progress=tp.rank == 0)
    pages_per_req, rng = runtime.config.max_pages, np.random.default_rng(0)
    for req in range(max(sizes)):
        runtime.run(prefill_batch(req, args.context, pages_per_req, 128000, rng))
    rows = [_row(runtime, tp, bs, args, rng) for bs in sizes]
    if tp.rank == 0:
        _write(runtime, tp, report, args, rows)
    runtime.release()
    torch.cuda.synchronize(device)
    if tp.size > 1:
        shutdown()
    return 0


def _row(
    runtime: Any, tp: Any, bs: int, args: argparse.Namespace, rng: np.random.Generator
) -> dict[str, Any]:
    """One batch size's eager and graphed step, per-rank host time and the collectives' share."""
    device, pages_per_req = tp.device, runtime.config.max_pages
    batch = decode_batch(bs, args.context, pages_per_req, 128000, rng)
    eager = median(time_us(lambda b=batch: runtime.run(b, eager=True), args.iters, device))
    graph = median(time_us(lambda b=batch: runtime.run(b), args.iters, device))
    host = median(time_us(lambda b=batch: runtime.run(b), args.iters, device, host_only=True))
    hosts = [host] * tp.size
    if tp.size > 1:
        dist.all_gather_object(hosts, host, group=tp.cpu_group)
    bucket = runtime.dispatcher.policy.bucket_for(bs)
    return {
        "bs": bs,
        "eager_us": eager,
        "graph_us": graph,
        "graph_host_us_per_rank": hosts,
        "speedup": eager / graph,
        "collective_kernels_in_graph": collectives_per_graph(runtime, bucket),
        "profile": collective_share(lambda b=batch: runtime.run(b), device),
        "step_message_us": channel_us(tp, batch) if tp.size > 1 else None,
    }


def _write(runtime: Any, tp: Any, report: Any, args: argparse.Namespace, rows: list[dict[str, Any]]) -> None:
    """Rank 0: the JSON under ``--out`` and one line per row."""
    device = tp.device
    result = {
        "bench": "decode_step_tp",
        "model": "llama-3-8b shape, random bf16 weights",
        "tp": tp.size,
        "context": args.context,
        "iters": args.iters,
        "backend": runtime.backend.name,
        "engine": report.engine,
        "allreduce": report.switches["GRAPHRT_ALLREDUCE"],
        "switches": report.switches,
        "env": environment(device),
        "capture_seconds": report.seconds,
        "rows": rows,
    }
    path = "" if tp.size == 1 else "_" + report.switches["GRAPHRT_ALLREDUCE"]
    out = Path(args.out) / f"decode_tp{tp.size}_{device.type}{path}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    for r in rows:
        print(json.dumps(r))
    print(f"written to {out}")


if __name__ == "__main__":
    raise SystemExit(main())
