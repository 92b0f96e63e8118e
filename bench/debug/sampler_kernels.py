"""Where the fused sampler's time goes at bs 1: each kernel's own duration, with PDL on and off.

Issue 25's 128k top-p row takes ~19.5 µs a call (target 15) while the 49k row, whose draw ends
in ``_scan``, takes 8.4. This replays graphs of ``REPS`` calls of ``fused_sample`` (as ``graphrt
bench sampler`` does) under ``torch.profiler`` and reports, per vocabulary, row kind and PDL
setting: µs per call of the whole graph (CUDA events) and each kernel's mean duration from the
profiler trace. Without PDL the kernels run one after the other, so their durations add up to
the call; with PDL ``_count`` starts early and its duration includes its wait for ``_scan``.

Run: ``PYTHONPATH=$PWD python bench/debug/sampler_kernels.py [--iters 30] [--json FILE]``.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict

import numpy as np
import torch
from torch.profiler import ProfilerActivity, profile

from graphrt.metadata.sampling import sampling_inputs
from graphrt.runtime.sampler.draw import sample_torch
from graphrt.runtime.sampler.launch import fused_sample
from graphrt.tools.bench.record import percentiles, time_us
from graphrt.tools.bench.sampler import KINDS, REPS, zipf_logits


def graph_of(fn, stream: torch.cuda.Stream) -> torch.cuda.CUDAGraph:
    """``REPS`` calls of ``fn`` captured in one graph (one eager call first, on ``stream``)."""
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        for _ in range(REPS):
            fn()
    return graph


def kernel_us(graph: torch.cuda.CUDAGraph, replays: int = 5) -> dict[str, float]:
    """Mean µs per call of each kernel name (profiler trace of ``replays`` replays)."""
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(replays):
            graph.replay()
        torch.cuda.synchronize()
    total: dict[str, float] = defaultdict(float)
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            total[event.name] += event.time_range.elapsed_us()
    return {name: us / (replays * REPS) for name, us in sorted(total.items())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iters", type=int, default=30)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    device = torch.device("cuda")
    stream = torch.cuda.Stream(device)
    rows = []
    for vocab in (49152, 128256):
        logits = zipf_logits(1, vocab, device, seed=7 + vocab)
        for kind in ("greedy", "top_p=0.9"):
            params = sampling_inputs([KINDS[kind]], np.arange(1) * 13 + 5, device)
            want = sample_torch(logits, params)
            for pdl in (True, False):
                got = fused_sample(logits, params, pdl=pdl)
                graph = graph_of(lambda lg=logits, pr=params, on=pdl: fused_sample(lg, pr, pdl=on), stream)
                call = percentiles([us / REPS for us in time_us(graph.replay, args.iters, device)])
                row = {
                    "vocab": vocab,
                    "kind": kind,
                    "pdl": pdl,
                    "same_token_as_torch": bool(torch.equal(got, want)),
                    "call_us_p50": call["p50"],
                    "kernels_us": kernel_us(graph),
                }
                rows.append(row)
                ks = ", ".join(f"{k} {v:.2f}" for k, v in row["kernels_us"].items())
                print(
                    f"{vocab:>6} {kind:>10} pdl={int(pdl)} call {call['p50']:6.2f} µs | {ks} | same={row['same_token_as_torch']}"
                )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows},
                f,
                indent=1,
            )


if __name__ == "__main__":
    main()
