"""Where the engine's host time goes on a GPU machine: cProfile of ``Engine.step()`` (tiny-llama).

Usage: ``python bench/gpu_engine_profile.py [BS] [STEPS]``. Prints the top functions by own
time for overlap off and on, then the host µs of the engine's DECODE graph launched alone
(device idle before each call, as ``graphrt bench host`` times ``launch``): the H100 profile
showed ≈ 90 µs per ``replay()`` inside the engine against 3-4 µs in ``bench host``. A
diagnostic (cProfile slows Python ~2x), not a result.
"""

from __future__ import annotations

import cProfile
import pstats
import sys

import numpy as np
import torch

from graphrt import Engine, ForwardMode
from graphrt.tools.bench.host import sample_us


def main(bs: int, steps: int) -> None:
    for overlap in (False, True):
        eng = Engine(
            "tiny-llama",
            device="cuda",
            overlap=overlap,
            buckets=[bs],
            max_batch_size=bs,
            max_context_len=1024,
        )
        rng = np.random.default_rng(0)
        for _ in range(bs):
            eng.add_request(rng.integers(0, 512, 128).tolist(), steps + 40)
        for _ in range(20):
            eng.step()
        torch.cuda.synchronize()
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(steps):
            eng.step()
        torch.cuda.synchronize()
        prof.disable()
        print(f"--- overlap {overlap}, bs {bs}, {steps} steps")
        pstats.Stats(prof).sort_stats("tottime").print_stats(24)
        print(f"bare launch of the engine's DECODE graph, host µs p50: {launch_us(eng, bs):.1f}")
        eng.close()


def launch_us(eng: Engine, bs: int, iters: int = 200) -> float:
    """Host µs p50 of ``replay()`` of the engine's DECODE graph for ``bs``, the device idle before each."""
    graph = eng.runtime.dispatcher.graphs[(ForwardMode.DECODE, bs)]
    return float(np.median(sample_us(graph.replay, iters, eng.device)))


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 16, int(sys.argv[2]) if len(sys.argv) > 2 else 300)
