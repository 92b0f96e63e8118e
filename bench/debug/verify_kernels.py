"""Per-kernel device time of a speculative engine's bs-1 graphs: its TARGET_VERIFY beside its
DECODE and the plain engine's DECODE (why a verify round costs 2.5 decode steps on SmolLM2, and
why the speculative engine's DECODE replays slower than plain's).

Usage (GPU machine): ``python bench/debug/verify_kernels.py MODEL [STEPS] [REPLAYS]``. Builds
both engines on CUDA at bs 1 (n-gram, ``STEPS`` drafted tokens, default 4), runs one generate on
``bench-spec``'s first copy prompt so every graph is captured, then replays each graph ``REPLAYS`` times (default
20; a replay rewrites the KV slots its last step wrote with the same values) under
``torch.profiler`` and prints each kernel's device µs per replay. A diagnostic, not a result.
"""

from __future__ import annotations

import sys
from collections import defaultdict

import torch
from torch.profiler import ProfilerActivity, profile

from graphrt import Engine, ForwardMode
from graphrt.tools.bench.spec_workloads import PROMPTS_DIR, prompt_ids


def kernels_us(graph, replays: int) -> dict[str, float]:
    """Device µs per replay of each kernel of ``graph`` (its replays under the profiler)."""
    graph.replay()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(replays):
            graph.replay()
        torch.cuda.synchronize()
    out: dict[str, float] = defaultdict(float)
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            out[event.name[:60]] += event.device_time / replays
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def show(label: str, engine: Engine, mode: ForwardMode, replays: int) -> None:
    graph = engine.runtime.capturer.dispatcher.graphs.get((mode, 1))
    if graph is None:
        print(f"{label}: no {mode.name} graph at bs 1")
        return
    times = kernels_us(graph, replays)
    print(f"{label} {mode.name}: {sum(times.values()):.1f} µs of kernels, {len(times)} kinds")
    for name, us in list(times.items())[:14]:
        print(f"    {us:8.1f}  {name}")


def main(model: str, steps: int, replays: int) -> None:
    for spec in (None, {"method": "ngram", "num_steps": steps}):
        engine = Engine(model, device="cuda", max_batch_size=1, max_context_len=1024, speculative=spec)
        prompts = prompt_ids("copy", model, engine.model.vocab_size, 1, 32, PROMPTS_DIR)
        engine.generate(prompts, 96)
        label = "ngram" if spec else "plain"
        for mode in (ForwardMode.DECODE, ForwardMode.TARGET_VERIFY) if spec else (ForwardMode.DECODE,):
            show(label, engine, mode, replays)
        engine.close()


if __name__ == "__main__":
    args = sys.argv[1:]
    main(args[0], int(args[1]) if len(args) > 1 else 4, int(args[2]) if len(args) > 2 else 20)
