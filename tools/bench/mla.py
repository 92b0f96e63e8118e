"""Per-layer FlashMLA sparse-MLA time: both KV layouts, heads padded to 64 and 128.

For each (layout, padded heads, batch size) one layer's attention — the head-padding copy
plus the kernel, with the FP8 schedule planned once outside the loop as the runtime does per
step — is captured in a CUDA graph of ``REPS`` layers and replayed; the time per layer is
reported with FLOP and byte rates next to FlashMLA's published figure (H800: 410 TFLOPS,
bs 128, h 128, s_q 2, topk 2048 ≈ 356 µs/layer). Each run writes a new ``mla_cuda_q<q>_<UTC time>.json``.

Usage: ``python -m graphrt.tools.bench.mla [--out DIR] [--batch-sizes 1,32,128] [--q-len 1]``
"""

from __future__ import annotations

import dataclasses

import torch

from graphrt.attention.call import AttendCall
from graphrt.attention.flashmla import FlashMLABackend
from graphrt.kv.mla import FP8_BYTES, KV_LORA_RANK, QK_DIM, MLAKVCache, MLAShape
from graphrt.tools.bench.mla_inputs import decode_meta, random_slots, sparse_for
from graphrt.tools.bench.record import header, write_result
from graphrt.tools.cli.args import Parser, UsageError, batch_sizes, fail, positive_int, resolve_device
from graphrt.tools.cli.console import bench_progress, wide_console

TOPK, CONTEXT, PAGE_SIZE, MODEL_HEADS, REPS = 2048, 8192, 64, 16, 20
PUBLISHED = {
    "source": "FlashMLA README / 20250929 deep dive",
    "hardware": "H800 SXM5",
    "shape": "bs128 h128 s_q2 topk2048 fp8",
    "tflops": 410,
    "us_per_layer": 356,
}


def _cache(layout: str, bs: int, device: torch.device) -> MLAKVCache:
    pages = bs * CONTEXT // PAGE_SIZE + 1
    cache = MLAKVCache(MLAShape(1, PAGE_SIZE, pages, 8, TOPK, MODEL_HEADS), layout, torch.bfloat16, device)
    n = cache.num_live_slots
    rows = torch.randn(n, QK_DIM, device=device, dtype=torch.bfloat16)
    cache.store_latent(0, torch.arange(n, device=device), rows)
    return cache


def bench_one(layout: str, padded: int, bs: int, q_len: int, device: torch.device) -> dict:
    """One layer's time (µs), TFLOPS and KV GB/s for (layout, padded heads, bs, q_len)."""
    cache = _cache(layout, bs, device)
    tokens = bs * q_len
    # NOTE: each request selects topk slots of its own context, as the indexer would.
    slots = random_slots(tokens, TOPK, CONTEXT, [TOPK] * tokens, device)
    slots += (torch.arange(tokens, device=device) // q_len * CONTEXT)[:, None].int()
    q = torch.randn(tokens, MODEL_HEADS, QK_DIM, device=device, dtype=torch.bfloat16)
    meta = decode_meta(bs, q_len, device)
    backend = FlashMLABackend(MODEL_HEADS, layout, TOPK, padded_heads=padded)
    sparse = sparse_for(slots, padded, bs)
    call = AttendCall(q, cache.kv[0], cache.kv[0], meta, 192**-0.5, group=sparse)
    call = dataclasses.replace(call, plan=backend.plan(call))
    for _ in range(3):
        backend.forward(call)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(REPS):
            backend.forward(call)
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    iters = 20
    start.record()
    for _ in range(iters):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    us = start.elapsed_time(end) * 1e3 / (iters * REPS)
    flop = 2 * tokens * padded * TOPK * (QK_DIM + KV_LORA_RANK)
    kv_bytes = tokens * TOPK * (FP8_BYTES if layout == "fp8" else 2 * QK_DIM)
    return {
        "layout": layout,
        "padded_heads": padded,
        "bs": bs,
        "q_len": q_len,
        "topk": TOPK,
        "us_per_layer": round(us, 2),
        "tflops": round(flop / us / 1e6, 1),
        "gbps_kv": round(kv_bytes / us / 1e3, 1),
    }


def main(argv: list[str] | None = None) -> int:
    """``python -m graphrt.tools.bench.mla``: needs CUDA and sgl_kernel's FlashMLA."""
    parser = Parser(prog="python -m graphrt.tools.bench.mla", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--out", default="bench/results", metavar="DIR", help="results directory (a new file per run)"
    )
    parser.add_argument(
        "--batch-sizes", type=batch_sizes, default="1,32,128", help="comma-separated batch sizes"
    )
    parser.add_argument("--q-len", type=positive_int, default=1, help="query tokens per request")
    args = parser.parse_args(argv)
    device = resolve_device("cuda")
    rows = []
    with bench_progress() as progress:
        task = progress.add_task("", total=4 * len(args.batch_sizes))
        for layout in ("bf16", "fp8"):
            for padded in (64, 128):
                for bs in args.batch_sizes:
                    progress.update(task, description=f"{layout} heads {padded} bs={bs}")
                    rows.append(bench_one(layout, padded, bs, args.q_len, device))
                    progress.advance(task)
    result = {**header("mla_layer", args, device), "published": PUBLISHED, "rows": rows}
    out = write_result(result, args.out, f"mla_cuda_q{args.q_len}")
    wide_console().print_json(data=rows)
    wide_console().print(f"written to {out}")
    return 0


if __name__ == "__main__":
    try:
        raise SystemExit(main())
    except UsageError as err:
        raise SystemExit(fail("bench_mla", err)) from None
