"""Host phases of a graphed DECODE ``run()`` per page size, context and batch size (CPU-friendly).

``PYTHONPATH=<tree> python bench/debug/host_phases.py [--ps 1,16] [--ctx 4096,131072]
[--bs 1,16,64,256] [--iters 300] [--json FILE]``

Same runtime as ``graphrt bench host`` (tiny-llama, buckets 1/8/64/256, requests of 512
tokens) and the same phases as ``graphrt bench host --profile``, but the graphs are captured
*host-only*: each (mode, bucket) gets the update a capture writes, its host scalars and a static
output of the forward's shape, and a replay that does nothing. The profile stubs every replay
anyway, and capturing the real forward on a CPU gathers ``bucket x max_context_len`` keys per
layer (17 GB at bs 256, ctx 128k), so this is what lets 128k run on a 24 GB host. It imports
only what the runtime had before issue 25's host work, so one script times both revisions:
``PYTHONPATH=/tmp/base python bench/debug/host_phases.py`` against ``PYTHONPATH=$PWD ...``.
"""

from __future__ import annotations

import argparse
import json
from types import SimpleNamespace

import numpy as np
import torch

from graphrt import GraphRuntime, KVShape, PagedKVCache, ReqToToken, RuntimeConfig
from graphrt.capture import EmulatedEngine
from graphrt.kv.ledger import KVWrites
from graphrt.models import TinyLlama, preset
from graphrt.runtime.capturer import empty_batch
from graphrt.step import ForwardMode
from graphrt.tools.bench.peer import make_batch
from graphrt.tools.bench.profile_host import CYCLE, SteadyDecode, phases, steady_us, timed_us

MODE = ForwardMode.DECODE
# NOTE: one intra-op thread: a clone of the bs-256 logits otherwise wakes an OpenMP team (a CPU
# artefact; on CUDA the clone is a device copy).
torch.set_num_threads(1)


def build(max_bs: int, ps: int, ctx: int, real: int) -> GraphRuntime:
    """tiny-llama on the CPU, buckets 1/8/64/256 up to ``max_bs``, graphs captured host-only."""
    cfg = preset("tiny-llama")
    device = torch.device("cpu")
    per_req = -(-(real + 16 + CYCLE) // ps)
    shape = KVShape(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, ps, max_bs * per_req + 1)
    kv = PagedKVCache(shape, torch.float32, device)
    r2t = ReqToToken(max_bs, ctx, ps, kv.dummy_slot, device)
    buckets = tuple(sorted({1, 8, 64, 256, max_bs} & set(range(1, max_bs + 1))))
    config = RuntimeConfig(
        max_batch_size=max_bs, max_context_len=ctx, page_size=ps, buckets=buckets, capture_modes=(MODE,)
    )
    model = TinyLlama.from_seed(cfg, 0, device, torch.float32)
    rt = GraphRuntime(model, kv, r2t, config, vocab_size=cfg.vocab_size)
    cap, rows = rt.capturer, rt.rows_per_req(MODE)
    for bucket in reversed(buckets):
        rt.families.write(empty_batch(MODE), bucket, bucket * rows)
        out = torch.zeros(bucket * rows, cfg.vocab_size)
        graph, out = EmulatedEngine().capture((MODE, bucket), lambda out=out: out.zero_(), 0)
        graph.replay = lambda: None  # type: ignore[method-assign]
        graph.info.host_scalars = cap.host_scalars(MODE, rows, False)
        cap.dispatcher.add(MODE, bucket, graph)
        cap.outputs[(MODE, bucket)] = out
    cap.routes.clear()
    rt.families.forget()
    return rt


def measure(rt: GraphRuntime, bs: int, iters: int, real: int) -> dict[str, float]:
    """p50 µs of the steady ``run()`` (replay a no-op) and of each phase at ``bs``."""
    rng = np.random.default_rng(bs)
    batch = make_batch("decode", rt, bs, real, rng)
    rt.run(batch)
    steady = SteadyDecode(rt, bs, real, rng)
    rows = {"run": steady_us(rt, steady, iters)}
    steady.reset()
    # NOTE: the second step of a cycle: its position (real + 1) lies inside a page when
    # page_size > 1, as 15 of 16 decode steps do, so the page check's gather is timed.
    rt.run(steady.next())
    batch = steady.next()
    rows["run_rewrite"] = timed_us(lambda: rt.run(batch), iters)
    writes = KVWrites.of(batch, scratch=rt.plan(MODE).scratch)
    rt.req_to_token.ledger.truncate(writes.rows, writes.starts)
    rows |= phases(rt, batch, iters)
    return {k: float(np.percentile(v, 50)) for k, v in rows.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ps", default="1,16")
    parser.add_argument("--ctx", default="4096,131072")
    parser.add_argument("--bs", default="1,16,64,256")
    parser.add_argument("--iters", type=int, default=300)
    parser.add_argument("--real", type=int, default=512)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    sizes = [int(x) for x in args.bs.split(",")]
    results = []
    for ps in (int(x) for x in args.ps.split(",")):
        for ctx in (int(x) for x in args.ctx.split(",")):
            rt = build(max(sizes), ps, ctx, args.real)
            for bs in sizes:
                row = measure(rt, bs, args.iters, args.real)
                results.append(SimpleNamespace(ps=ps, ctx=ctx, bs=bs, **row))
            del rt
    names = [k for k in vars(results[0]) if k not in ("ps", "ctx", "bs")]
    print(f"{'ps':>3} {'ctx':>7} {'bs':>4} " + " ".join(f"{n[:10]:>10}" for n in names))
    for r in results:
        print(f"{r.ps:>3} {r.ctx:>7} {r.bs:>4} " + " ".join(f"{getattr(r, n):>10.1f}" for n in names))
    if args.json:
        with open(args.json, "w") as f:
            json.dump([vars(r) for r in results], f, indent=1)


if __name__ == "__main__":
    main()
