"""``graphrt bench host``: host cost of one step, graphrt vs an SGLang-style peer vs the floors.

Per mode, batch size, page size and ``max_context_len`` (every request holds ``--real-len``
tokens): host p50/p99 of ``Batch.create``, of ``run()`` and of its phases (validate, the KV
isolation check, write+upload, launch); the peer's prepare (seed 001's replay path for the mode, torch ops on
static buffers of the same shapes, its ``.item()`` included; ``tools/bench/peer.py``); the
floors (one pinned H2D copy of the host mirror, one replay of a 1-node graph); the GPU time
of the replay, and on CUDA its kernel breakdown (``gpu_kernels``: five replays profiled back to
back, top kernels by device time). The device is synchronized before every timed call, so host times are those
of an idle GPU. The peer's page table must equal graphrt's over each row's real pages: the
bench asserts it before timing. JSON under ``bench/results/`` (never overwritten).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from rich.console import Console
from rich.table import Table

from graphrt import GraphRuntime, KVShape, PagedKVCache, ReqToToken, RuntimeConfig
from graphrt.kv.ledger import KVWrites
from graphrt.models import TinyLlama, preset
from graphrt.step import Batch, ForwardMode, SpecGeometry
from graphrt.tools.bench.device_ops import profile_steps
from graphrt.tools.bench.host_contexts import compare_contexts, print_contexts
from graphrt.tools.bench.peer import MODES as CASES
from graphrt.tools.bench.peer import Peer, make_batch
from graphrt.tools.bench.profile_host import CYCLE, SteadyDecode, run_profile, steady_us
from graphrt.tools.cli.args import resolve_device
from graphrt.tools.cli.env import environment

SPEC_CHAIN = SpecGeometry(num_steps=3, topk=1)
SPEC_TREE = SpecGeometry(num_steps=3, topk=2, num_draft_tokens=4)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def sample_us(fn: Callable[[], object], iters: int, device: torch.device) -> np.ndarray:
    """Host microseconds of ``fn()`` per call, the device idle (synced) before each."""
    out = np.empty(iters)
    for i in range(iters):
        _sync(device)
        start = time.perf_counter()
        fn()
        out[i] = (time.perf_counter() - start) * 1e6
    _sync(device)
    return out


def gpu_us(fn: Callable[[], object], iters: int, device: torch.device) -> float | None:
    if device.type != "cuda":
        return None
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(iters):
        _sync(device)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    return float(np.median(times))


def _stats(samples: np.ndarray) -> dict[str, float]:
    return {"p50": float(np.percentile(samples, 50)), "p99": float(np.percentile(samples, 99))}


def build(
    case: str, device: torch.device, max_bs: int, ps: int, ctx: int, real: int, room: int = CYCLE
) -> GraphRuntime:
    """tiny-llama with a KV cache for ``real``-token requests (``room`` more tokens each: the
    steady decode steps) and a ``ctx``-wide request table."""
    mode, spec = CASES[case]
    cfg = preset("tiny-llama")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    rows = max_bs * (1 + spec.topk) if spec else max_bs  # NOTE: scratch rows for tree branches
    per_req = -(-(real + 16 + room) // ps)
    kv = PagedKVCache(
        KVShape(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, ps, rows * per_req + 1), dtype, device
    )
    r2t = ReqToToken(rows, ctx, ps, kv.dummy_slot, device)
    buckets = tuple(sorted({1, 8, 64, 256, max_bs} & set(range(1, max_bs + 1))))
    config = RuntimeConfig(
        max_batch_size=max_bs,
        max_context_len=ctx,
        page_size=ps,
        buckets=buckets,
        capture_modes=(mode,),
        speculative=spec,
        record_kernels=False,
        warmup=1,
    )
    model = TinyLlama.from_seed(cfg, 0, device, dtype)
    runtime = GraphRuntime(model, kv, r2t, config, vocab_size=cfg.vocab_size)
    runtime.capture()
    return runtime


def one_node_graph(device: torch.device) -> Callable[[], None]:
    """Replay of a graph with one tiny kernel (the launch floor)."""
    x = torch.zeros(1, device=device)
    if device.type == "cuda":
        g = torch.cuda.CUDAGraph()
        s = torch.cuda.Stream(device)
        with torch.cuda.stream(s):
            x.add_(1)
        torch.cuda.synchronize(device)
        with torch.cuda.graph(g, stream=s):
            x.add_(1)
        return g.replay
    from graphrt.capture import EmulatedEngine

    graph, _ = EmulatedEngine().capture("floor", lambda: x.add_(1), 0)
    return graph.replay


def measure(rt: GraphRuntime, peer: Peer, batch: Batch, args: argparse.Namespace) -> dict:
    dev, iters = rt.device, args.iters
    bucket, graph = rt.dispatcher.select(batch.mode, batch.bs)  # type: ignore[misc]
    rows = rt.rows_per_req(batch.mode)
    pad = rt.pad_values(batch.mode)
    rt.run(batch)
    peer.prepare(batch)
    _sync(dev)
    peer.assert_same_pages(rt, batch)
    fields = {k: getattr(batch, k) for k in ("input_ids", "seq_lens", "req_pool_indices", "out_cache_loc")}
    q = None if batch.mode is ForwardMode.DECODE else batch.q_lens
    step = rt.groups.step
    ledger, scratch = rt.req_to_token.ledger, rt.plan(batch.mode).scratch
    row = {
        "create": _stats(
            sample_us(
                lambda: Batch.create(batch.mode, q_lens=q, tree_mask=batch.tree_mask, **fields), iters, dev
            )
        ),
        "run": _stats(sample_us(lambda: rt.run(batch), iters, dev)),
        "run_rewrite": None,
        "validate": _stats(sample_us(lambda: batch.check(rt.limits), iters, dev)),
        "isolate": _stats(sample_us(lambda: ledger.check(KVWrites.of(batch, scratch=scratch)), iters, dev)),
        "write_upload": _stats(
            sample_us(lambda: rt.groups.write(batch, bucket, bucket * rows, pad), iters, dev)
        ),
        "launch": _stats(sample_us(graph.replay, iters, dev)),
        "peer_prepare": _stats(sample_us(lambda: peer.prepare(batch), iters, dev)),
        "floor_copy": _stats(
            sample_us(
                lambda: step.arena[: step.host_arena.numel()].copy_(step.host_arena, non_blocking=True),
                iters,
                dev,
            )
        ),
        "gpu_replay_us": gpu_us(graph.replay, iters, dev),
        # NOTE: where the replay's device time goes: what tells 4k from 128k replays apart
        "gpu_kernels": profile_steps(graph.replay, dev, 5, top=10),
        "bucket": bucket,
    }
    if batch.mode is ForwardMode.DECODE:
        # NOTE: a decode step appends; the same batch again rewrites its own tail (a verify's
        # path, reported as run_rewrite). ``run`` times the steady state.
        row["run_rewrite"] = row["run"]
        row["run"] = _stats(
            steady_us(rt, SteadyDecode(rt, batch.bs, args.real_len, np.random.default_rng(1)), iters)
        )
    row["peer_total_p50"] = row["peer_prepare"]["p50"] + row["launch"]["p50"]
    row["peer_over_run"] = row["peer_total_p50"] / row["run"]["p50"]
    return row


def run_bench_host(args: argparse.Namespace) -> int:
    device = resolve_device(args.device)
    if args.smoke:
        args.batch_sizes, args.page_sizes, args.context_lens = "1,2", "16", "256"
        args.real_len, args.iters = 40, 5
    if args.profile:
        return run_profile(args, build, device)
    given = args.batch_sizes if args.batch_sizes is not None else "1,8,64,256"
    sizes = [int(x) for x in given.split(",")] if isinstance(given, str) else list(given)
    modes = args.modes.split(",") if args.modes else list(CASES)
    floor = one_node_graph(device)
    rng = np.random.default_rng(0)
    rows: list[dict] = []
    contexts: list[dict] = []
    for case in modes:
        for ps in (int(x) for x in args.page_sizes.split(",")):
            built = {
                int(c): build(case, device, max(sizes), ps, int(c), args.real_len)
                for c in args.context_lens.split(",")
            }
            for ctx, rt in built.items():
                peer = Peer(rt, CASES[case][1])
                for bs in sizes:
                    batch = make_batch(case, rt, bs, args.real_len, rng)
                    row = measure(rt, peer, batch, args)
                    row |= {"mode": case, "bs": bs, "page_size": ps, "max_context_len": ctx}
                    row["floor_launch"] = _stats(sample_us(floor, args.iters, device))
                    rows.append(row)
                    # NOTE: one line per row as it finishes: a long sweep cut short keeps them.
                    Console(stderr=True).log(
                        f"{case} ps {ps} ctx {ctx} bs {bs}: run {row['run']['p50']:.1f} µs, "
                        f"peer {row['peer_total_p50']:.1f} µs"
                    )
            if case == "decode" and len(built) > 1:
                contexts += compare_contexts(built, ps, sizes, args.real_len, args.iters)
            for rt in built.values():
                rt.release()  # NOTE: waits for the device before dropping graphs and pool
            del built
    result = {
        "bench": "host",
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "git_commit": _git_commit(),
        "args": vars(args),
        "env": environment(device),
        "rows": rows,
        "contexts": contexts,
    }
    out = _out_path(Path(args.out), device)
    out.write_text(json.dumps(result, indent=2) + "\n")
    _print(result, out)
    print_contexts(contexts)
    return 0


def _git_commit() -> str | None:
    try:
        done = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return None
    return done.stdout.strip()


def _out_path(folder: Path, device: torch.device) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    path, n = folder / f"host_{device.type}_{stamp}.json", 1
    while path.exists():  # NOTE: never overwrite a result
        path, n = folder / f"host_{device.type}_{stamp}_{n}.json", n + 1
    return path


def _print(result: dict, out: Path) -> None:
    table = Table(
        title=f"host µs per step, p50 (p99) — {result['env']['device']}, torch {result['env']['torch']}"
    )
    cols = (
        "mode",
        "ps",
        "ctx",
        "bs",
        "create",
        "run()",
        "validate",
        "isolate",
        "write+up",
        "launch",
        "peer",
        "peer/run",
    )
    for col in (*cols, "copy floor", "launch floor", "GPU µs"):
        table.add_column(col, justify="right")
    for r in result["rows"]:

        def f(key: str, r: dict = r) -> str:
            return f"{r[key]['p50']:.1f} ({r[key]['p99']:.0f})"

        gpu = r["gpu_replay_us"]
        table.add_row(
            r["mode"],
            str(r["page_size"]),
            str(r["max_context_len"]),
            str(r["bs"]),
            f("create"),
            f("run"),
            f("validate"),
            f("isolate"),
            f("write_upload"),
            f("launch"),
            f("peer_prepare"),
            f"{r['peer_over_run']:.1f}x",
            f("floor_copy"),
            f("floor_launch"),
            "-" if gpu is None else f"{gpu:.1f}",
        )
    Console(width=200).print(table)
    Console().print(f"written to {out}")
