"""Per-kernel device time of a speculative engine's bs-1 graphs: its TARGET_VERIFY beside its
DECODE and the plain engine's DECODE (what a verify round costs against a decode step, and why
the speculative engine's DECODE may replay slower than plain's).

Usage (GPU machine): ``python bench/debug/verify_kernels.py MODEL [STEPS] [REPLAYS]``. Builds
both engines on CUDA at bs 1 (n-gram, ``STEPS`` drafted tokens, default 4), runs one generate
on ``bench-spec``'s first copy prompt so every graph is captured, then replays each graph
``REPLAYS`` times (default 20; a replay rewrites the KV slots its last step wrote with the same
values) back to back under the benches' profiler (``profile_steps``) and prints each kernel
group's device µs per replay. A diagnostic, not a result.
"""

from __future__ import annotations

import sys

import torch

from graphrt import Engine, ForwardMode
from graphrt.tools.bench.device_ops import profile_steps
from graphrt.tools.bench.spec_workloads import PROMPTS_DIR, prompt_ids


def show(label: str, engine: Engine, mode: ForwardMode, replays: int) -> None:
    """The bs-1 graph of ``mode``: busy µs and launches per replay, then its top kernels."""
    graph = engine.runtime.capturer.dispatcher.graphs.get((mode, 1))
    if graph is None:
        print(f"{label}: no {mode.name} graph at bs 1")
        return
    graph.replay()  # NOTE: warm, out of the profiled window
    found = profile_steps(graph.replay, torch.device("cuda"), replays, top=14)
    print(f"{label} {mode.name}: busy {found['busy_us']:.1f} µs, {found['launches']:.0f} launches a replay")
    for k in found["kernels"]:
        print(f"    {k['us']:8.1f} µs  x{k['launches']:.0f}  {k['kernel']}")


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
