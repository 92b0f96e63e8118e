"""cProfile of graphed DECODE ``run()`` steps on a GPU host, replays real (not stubbed):
``python bench/gpu_host_profile.py [bs] [ctx]``. Prints run() p50 and the top functions by own
time; a diagnostic for issue 25's host target (``graphrt bench host --profile`` stubs replays)."""

from __future__ import annotations

import cProfile
import io
import pstats
import sys
import time

import numpy as np
import torch

from graphrt.tools.bench.host import build
from graphrt.tools.bench.profile_host import CYCLE, SteadyDecode


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def main(bs: int, ctx: int) -> None:
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    rt = build("decode", device, max(bs, 8), 16, ctx, 512, room=CYCLE)
    steady = SteadyDecode(rt, bs, 512, np.random.default_rng(0))
    for synced in (True, False):
        steady.reset()
        times = []
        for _ in range(CYCLE - 1):
            batch = steady.next()
            if synced:
                sync()
            start = time.perf_counter_ns()
            rt.run(batch)
            times.append((time.perf_counter_ns() - start) / 1e3)
        sync()
        print(
            f"bs {bs} ctx {ctx} synced={synced}: run() p50 {np.percentile(times, 50):.1f} us, p10 {np.percentile(times, 10):.1f}"
        )
    steady.reset()
    profile = cProfile.Profile()
    batches = [steady.next() for _ in range(CYCLE - 1)]
    steady.reset()
    profile.enable()
    for batch in batches:
        rt.run(batch)
    profile.disable()
    sync()
    text = io.StringIO()
    pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(25)
    print(text.getvalue())


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 1, int(sys.argv[2]) if len(sys.argv) > 2 else 4096)
