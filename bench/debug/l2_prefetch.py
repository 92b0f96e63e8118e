"""Does an L2 prefetch of a projection's weights, issued while the device is latency-bound, pay?

The question behind issue 25's 1B and 8B floors: per layer the attention chain (rope_store, the
split kernel, its merge) runs ~6-8 us during which HBM is idle. If a kernel of that chain pulls
the next GEMM's first megabytes into L2, the GEMM reads them from L2 and streams less from HBM.

Measured here, one run, CUDA events, p50 of ``--iters`` trials, each after an L2 flush:
- ``gemm``: the skinny GEMM alone (the baseline);
- ``pf+sleep+gemm`` per prefetch flavour and size: prefetch kernel, a sleep long enough for it to
  land, then the GEMM (only the GEMM timed): how much an L2-resident share saves;
- ``pf`` per flavour: the prefetch kernel alone (the cost of issuing it);
- ``sleep+gemm`` vs ``pf+sleep+gemm`` total: the realistic overlap, the sleep standing in for the
  attention chain.
Flavours: per-line ``prefetch.global.L2`` (normal / ``evict_last``) and the bulk
``cp.async.bulk.prefetch.L2`` (TMA). Outputs of every GEMM are checked equal to the baseline's.

Run: ``PYTHONPATH=$PWD python bench/debug/l2_prefetch.py [--iters 50] [--json $OUT/l2.json]``.
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch
import triton
import triton.language as tl

from graphrt.kernels.skinny import skinny_linear
from graphrt.tools.bench.record import time_us

LINE = 128  # bytes of an L2 line

ASM = {
    "line": "{ prefetch.global.L2 [$1]; mov.u32 $0, 0; }",
    "line_last": "{ prefetch.global.L2::evict_last [$1]; mov.u32 $0, 0; }",
}


@triton.jit
def _pf_lines(base, nlines, BLOCK: tl.constexpr, ASM_TEXT: tl.constexpr):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    for start in range(pid * BLOCK, nlines, nprog * BLOCK):
        line = tl.minimum(start + tl.arange(0, BLOCK), nlines - 1)
        ptr = base + line.to(tl.int64) * 128
        tl.inline_asm_elementwise(ASM_TEXT, "=r,l", [ptr], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _pf_bulk(base, nchunks, CHUNK: tl.constexpr, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    for start in range(pid * BLOCK, nchunks, nprog * BLOCK):
        chunk = tl.minimum(start + tl.arange(0, BLOCK), nchunks - 1)
        ptr = base + chunk.to(tl.int64) * CHUNK
        size = tl.full([BLOCK], CHUNK, tl.int32)
        tl.inline_asm_elementwise(
            "{ cp.async.bulk.prefetch.L2.global [$1], $2; mov.u32 $0, 0; }",
            "=r,l,r",
            [ptr, size],
            dtype=tl.int32,
            is_pure=False,
            pack=1,
        )


def prefetch(flavour: str, w: torch.Tensor, nbytes: int, programs: int) -> None:
    base = w.view(torch.uint8)
    if flavour == "bulk":
        chunk = 16384
        _pf_bulk[(programs,)](base, nbytes // chunk, CHUNK=chunk, BLOCK=32, num_warps=1)
    else:
        _pf_lines[(programs,)](base, nbytes // LINE, BLOCK=512, ASM_TEXT=ASM[flavour], num_warps=4)


def timed(fn_before, fn_timed, flush: torch.Tensor, iters: int, sleep: int) -> list[float]:
    out = []
    for _ in range(iters):
        flush.add_(1)  # NOTE: 256 MB through L2 evicts the weights
        fn_before()
        if sleep:
            torch.cuda._sleep(sleep)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn_timed()
        end.record()
        end.synchronize()
        out.append(start.elapsed_time(end) * 1e3)
    return out


def total(fns, flush: torch.Tensor, iters: int) -> list[float]:
    out = []
    for _ in range(iters):
        flush.add_(1)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for fn in fns:
            fn()
        end.record()
        end.synchronize()
        out.append(start.elapsed_time(end) * 1e3)
    return out


SHAPES = {"1b_gate_up": (16384, 2048), "1b_o": (2048, 2048), "8b_gate_up": (28672, 4096)}


def layers_graph(
    dev: torch.device, spin: int, layers: int, pf: tuple[str, int, int] | None, iters: int
) -> float:
    """p50 us of one replay of ``layers`` x (qkv, sleep ~ attention, o, gate_up, down) of the 1B shape,
    with the gate_up weight's first ``pf`` bytes prefetched on a side stream forked after qkv."""
    shapes = ((3072, 2048), (2048, 2048), (16384, 2048), (2048, 8192))
    ws = [
        [torch.randn(n, k, device=dev, dtype=torch.bfloat16) * k**-0.5 for n, k in shapes]
        for _ in range(layers)
    ]
    x = torch.randn(1, 2048, device=dev, dtype=torch.bfloat16)
    side = torch.cuda.Stream(dev)

    def step() -> torch.Tensor:
        h = x
        for qkv, o, gate_up, down in ws:
            a = skinny_linear(h, qkv)[:, :2048].contiguous()
            if pf is not None:
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):
                    prefetch(pf[0], gate_up, pf[1], pf[2])
            torch.cuda._sleep(spin)
            h = skinny_linear(a, o)
            g = skinny_linear(h, gate_up)[:, :8192].contiguous()
            h = skinny_linear(g, down)
        if pf is not None:
            torch.cuda.current_stream().wait_stream(side)
        return h

    s = torch.cuda.Stream(dev)
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        step()
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    return statistics.median(time_us(graph.replay, iters, dev))


def graph_rows(dev: torch.device, spin: int, iters: int) -> list[dict]:
    rows = []
    base = layers_graph(dev, spin, 16, None, iters)
    print(f"16 layers, no prefetch: {base:7.1f} us", flush=True)
    for flavour in ("line_last", "line", "bulk"):
        for mb in (8, 16, 24, 32):
            for programs in (16, 32, 64):
                t = layers_graph(dev, spin, 16, (flavour, mb << 20, programs), iters)
                rows.append({"flavour": flavour, "mb": mb, "programs": programs, "us": t, "base_us": base})
                print(
                    f"16 layers, {flavour:9s} {mb:2d} MB on {programs:2d} programs: {t:7.1f} us ({t - base:+6.1f})",
                    flush=True,
                )
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--graph", action="store_true", help="only the 16-layer graph experiment")
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--programs", type=int, default=64)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    dev = torch.device("cuda")
    flush = torch.zeros(64 << 20, dtype=torch.float32, device=dev)
    sm = torch.cuda.get_device_properties(dev)
    spin = int(6e-6 * sm.clock_rate * 1e3)  # NOTE: ~6 us of cycles (clock_rate is in kHz)
    if args.graph:
        rows = graph_rows(dev, spin, args.iters)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(
                    {"device": torch.cuda.get_device_name(dev), "torch": torch.__version__, "rows": rows},
                    f,
                    indent=1,
                )
        return
    rows = []
    med = statistics.median
    for name, (n, k) in SHAPES.items():
        w = torch.randn(n, k, device=dev, dtype=torch.bfloat16) * k**-0.5
        x = torch.randn(1, k, device=dev, dtype=torch.bfloat16)
        ref = skinny_linear(x, w)
        base = med(timed(lambda: None, lambda x=x, w=w: skinny_linear(x, w), flush, args.iters, 0))
        hot = med(
            timed(
                lambda x=x, w=w: skinny_linear(x, w),
                lambda x=x, w=w: skinny_linear(x, w),
                flush,
                args.iters,
                0,
            )
        )
        s_g = med(
            total([lambda: torch.cuda._sleep(spin), lambda x=x, w=w: skinny_linear(x, w)], flush, args.iters)
        )
        row = {
            "shape": name,
            "n": n,
            "k": k,
            "mb": w.numel() * 2 / 2**20,
            "gemm_us": base,
            "gemm_l2_hot_us": hot,
        }
        row["sleep_gemm_us"] = s_g
        for flavour in ("line", "line_last", "bulk"):
            for mb in (8, 16, 24):
                nbytes = min(mb << 20, w.numel() * 2)
                pf = lambda f=flavour, b=nbytes, w=w: prefetch(f, w, b, args.programs)  # noqa: E731
                after = med(timed(pf, lambda x=x, w=w: skinny_linear(x, w), flush, args.iters, spin * 4))
                alone = med(timed(lambda: None, pf, flush, args.iters, 0))
                both = med(
                    total(
                        [pf, lambda: torch.cuda._sleep(spin), lambda x=x, w=w: skinny_linear(x, w)],
                        flush,
                        args.iters,
                    )
                )
                assert torch.equal(skinny_linear(x, w), ref)
                row[f"{flavour}_{mb}MB"] = {"gemm_after_us": after, "pf_us": alone, "pf_sleep_gemm_us": both}
                print(
                    f"{name} {flavour:9s} {mb:2d} MB: gemm {base:6.2f} -> {after:6.2f} us (hot {hot:6.2f});"
                    f" pf {alone:5.2f} us; sleep+gemm {s_g:6.2f} -> pf+sleep+gemm {both:6.2f} us",
                    flush=True,
                )
        rows.append(row)
    meta = {
        "device": torch.cuda.get_device_name(dev),
        "torch": torch.__version__,
        "triton": triton.__version__,
    }
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {"meta": meta, "spin_cycles": spin, "programs": args.programs, "rows": rows}, f, indent=1
            )


if __name__ == "__main__":
    main()
