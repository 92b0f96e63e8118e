"""Per-kernel device time of a speculative engine's bs-1 graphs: its TARGET_VERIFY beside its
DECODE and the plain engine's DECODE (what a verify round costs against a decode step, and why
the speculative engine's DECODE may replay slower than plain's).

Usage (GPU machine): ``python bench/debug/verify_kernels.py MODEL [STEPS] [REPLAYS] [DEVICE]``.
Builds both engines at bs 1 (n-gram, ``STEPS`` drafted tokens, default 4) and runs one generate
on ``bench-spec``'s first copy prompt so every graph is captured. A second generate then
profiles each graph inside a step of its own mode: the ``AT``-th replay of the graph launches
``REPLAYS`` times back to back (default 20; each repeats the step's writes) under the benches'
profiler (``profile_steps``), right after the engine wrote that step's metadata. A bare replay
outside a step would read what the last step of another mode left in the buffers the modes
share (a verify round's row indices, say). Prints each kernel group's device µs per replay. A
diagnostic, not a result; on the CPU (``DEVICE`` cpu) it only checks that every graph is reached.
"""

from __future__ import annotations

import sys
from typing import Any

import torch

from graphrt import Engine, ForwardMode
from graphrt.tools.bench.device_ops import profile_steps
from graphrt.tools.bench.spec_workloads import PROMPTS_DIR, prompt_ids

#: The replay of a graph that is profiled (later than the first: the step is a steady one).
AT = 4


class Profiled:
    """``graph`` with its :data:`AT`-th replay profiled over ``replays`` launches."""

    def __init__(self, graph: Any, replays: int, device: torch.device) -> None:
        self.graph, self.replays, self.device = graph, replays, device
        self.calls, self.found = 0, None

    def replay(self) -> None:
        self.calls += 1
        if self.calls == AT:
            self.found = profile_steps(self.graph.replay, self.device, self.replays, top=14)
        else:
            self.graph.replay()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.graph, name)


def show(label: str, mode: ForwardMode, profiled: Profiled | None) -> None:
    """Busy µs and launches per replay of ``mode``'s bs-1 graph, then its top kernels."""
    found = None if profiled is None else profiled.found
    if found is None or found["busy_us"] is None:
        calls = 0 if profiled is None else profiled.calls
        print(f"{label} {mode.name}: not profiled ({calls} replays of its bs-1 graph)")
        return
    print(f"{label} {mode.name}: busy {found['busy_us']:.1f} µs, {found['launches']:.0f} launches a replay")
    for k in found["kernels"]:
        print(f"    {k['us']:8.1f} µs  x{k['launches']:.0f}  {k['kernel']}")


def main(model: str, steps: int, replays: int, device: str) -> None:
    for spec in (None, {"method": "ngram", "num_steps": steps}):
        engine = Engine(model, device=device, max_batch_size=1, max_context_len=1024, speculative=spec)
        prompts = prompt_ids("copy", model, engine.model.vocab_size, 1, 32, PROMPTS_DIR)
        want = engine.generate(prompts, 96)
        modes = (ForwardMode.DECODE, ForwardMode.TARGET_VERIFY) if spec else (ForwardMode.DECODE,)
        capturer = engine.runtime.capturer
        profiled: dict[ForwardMode, Profiled] = {}
        for mode in modes:
            graph = capturer.dispatcher.graphs.get((mode, 1))
            if graph is not None:
                profiled[mode] = capturer.dispatcher.graphs[(mode, 1)] = Profiled(
                    graph, replays, engine.device
                )
        capturer.routes.clear()  # NOTE: routes hold their graphs; the next steps look them up again
        got = engine.generate(prompts, 96)
        label = "ngram" if spec else "plain"
        same = "equal" if got == want else "differ from"  # NOTE: a repeated replay repeats a step
        print(f"{label}: the profiled generate's tokens {same} the first's")
        for mode in modes:
            show(label, mode, profiled.get(mode))
        engine.close()


if __name__ == "__main__":
    args = sys.argv[1:]
    main(
        args[0],
        int(args[1]) if len(args) > 1 else 4,
        int(args[2]) if len(args) > 2 else 20,
        args[3] if len(args) > 3 else "cuda",
    )
