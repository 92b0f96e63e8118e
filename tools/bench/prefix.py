"""``graphrt bench prefix``: requests sharing a long system prompt, prefix caching off vs on.

``--requests`` prompts, each ``--system-tokens`` shared tokens (random ids, seed 0) followed by
``--user-tokens`` of its own, all submitted at once to an engine of ``--model`` (default
smollm2) with ``--max-batch-size`` rows (default: one per request), greedy, ``--new-tokens``
each. Two engines built the same way but for ``prefix_caching`` run the same prompts after
the same warm-up: a burst of the same shape over another system prompt (so the cache starts
without the shared one, and first-time costs of the step shapes fall outside the clock), then
a full garbage collection (the warm-up's, and the engine closed before). Per engine: time to
first token per request (from the submission of all of them), wall time, generated tokens per
second, prompt tokens prefilled, the prefix-cache counters, and each step until every request
has its first token (``trace``: wall ms, whether it prefilled, the requests it admitted and
the prompt tokens they compute, first tokens it produced) and the prefill steps that replayed
a MIXED graph (``mixed_replays``; ``--prefill-graph-tokens``, 0: none); the tokens of both
engines are compared (``tokens_equal``).
JSON: ``<out>/prefix_<UTC time>.json``.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import time
from typing import Any

import numpy as np
from rich.table import Table

from graphrt import Engine
from graphrt.engine.config import PREFILL_GRAPH_TOKENS
from graphrt.tools.bench.record import header, write_result
from graphrt.tools.cli.args import resolve_device
from graphrt.tools.cli.console import wide_console


def workload(vocab: int, requests: int, system: int, user: int) -> tuple[list[list[int]], list[list[int]]]:
    """The shared-prefix prompts, and a warm-up burst of the same shape over another system prompt."""
    rng = np.random.default_rng(0)
    shared = rng.integers(0, vocab, system).tolist()
    prompts = [shared + rng.integers(0, vocab, user).tolist() for _ in range(requests)]
    other = rng.integers(0, vocab, system).tolist()
    return prompts, [other + rng.integers(0, vocab, user).tolist() for _ in range(requests)]


def _traced_step(engine: Engine, seen: set[int]) -> tuple[list[tuple[int, int]], dict[str, Any]]:
    """One engine step and what it did: wall ms, whether it prefilled (a prefill step, or a
    mixed one admitting requests), the requests it admitted (``seen``: those admitted before)
    and the prompt tokens they compute (their uncached part)."""
    counts = engine.scheduler.counts
    before, start = counts.prefill_steps + counts.mixed_steps, time.perf_counter()
    produced = engine.step()
    ms = (time.perf_counter() - start) * 1e3
    new = [r for r in engine.running if r.rid not in seen]
    seen.update(r.rid for r in new)
    return produced, {
        "ms": round(ms, 3),
        "prefill": counts.prefill_steps + counts.mixed_steps > before,
        "admitted": len(new),
        "computed": sum(len(r.prompt) - r.cached for r in new),
        "first_tokens": 0,
    }


def measure(
    engine: Engine, prompts: list[list[int]], warm: list[list[int]], new_tokens: int
) -> dict[str, Any]:
    """Submit every prompt at once and step until all are done; TTFT, throughput, the trace."""
    engine.generate(warm, 2)
    gc.collect()  # NOTE: the warm-up's garbage and an engine closed before are not this one's steps
    before = engine.stats()
    start = time.perf_counter()
    ids = [engine.add_request(p, new_tokens) for p in prompts]
    first: dict[int, float] = {}
    steps: dict[int, int] = {}
    trace: list[dict[str, Any]] = []
    seen: set[int] = set()
    while engine.waiting or engine.running:
        if len(first) < len(ids):  # NOTE: traced until every request has its first token
            produced, step = _traced_step(engine, seen)
            trace.append(step)
        else:
            produced = engine.step()
        for rid, _ in produced:
            if rid not in first:
                first[rid], steps[rid] = time.perf_counter() - start, len(trace)
                trace[-1]["first_tokens"] += 1
    wall = time.perf_counter() - start
    outputs = [engine.finished.pop(i).output for i in ids]
    ttft = np.array([first[i] for i in ids]) * 1e3
    to_first = np.array([steps[i] for i in ids])
    stats = engine.stats()
    prefix = stats.prefix
    hit = (prefix.hit_tokens - before.prefix.hit_tokens) if prefix and before.prefix else 0
    return {
        "ttft_ms": {
            "mean": float(ttft.mean()),
            **{f"p{q}": float(np.percentile(ttft, q)) for q in (50, 90, 99)},
        },
        "steps_to_first_token": {"p50": float(np.median(to_first)), "max": int(to_first.max())},
        "wall_s": wall,
        "generated_tokens": sum(len(o) for o in outputs),
        "tokens_per_s": sum(len(o) for o in outputs) / wall,
        "prompt_tokens": sum(len(p) for p in prompts),
        "prefilled_tokens": sum(len(p) for p in prompts) - hit,
        "prefill_steps": stats.prefill_steps - before.prefill_steps,
        # NOTE: without --prefill-chunk, the prefill steps that replayed a MIXED graph
        "mixed_replays": stats.replays.get("MIXED", 0) - before.replays.get("MIXED", 0),
        "prefix": dataclasses.asdict(prefix) if prefix else None,
        "trace": trace,
        "outputs": outputs,
    }


def run_bench_prefix(args: argparse.Namespace) -> int:
    device = resolve_device(args.device)
    requests, system, user, new = args.requests, args.system_tokens, args.user_tokens, args.new_tokens
    context = -(-(system + user + new) // 16) * 16
    kw = {"device": device, "max_batch_size": args.rows or requests, "max_context_len": context}
    kw["prefill_chunk"] = getattr(args, "prefill_chunk", None)
    kw["prefill_graph_tokens"] = getattr(args, "prefill_graph_tokens", PREFILL_GRAPH_TOKENS)
    runs: dict[str, dict[str, Any]] = {}
    prompts: list[list[int]] = []
    warm: list[list[int]] = []
    for key, caching in (("off", False), ("on", True)):
        engine = Engine(args.model, prefix_caching=caching, **kw)
        if not prompts:
            prompts, warm = workload(engine.model.vocab_size, requests, system, user)
        runs[key] = measure(engine, prompts, warm, new)
        engine.close()
        del engine
    equal = runs["off"].pop("outputs") == runs["on"].pop("outputs")
    off, on = runs["off"], runs["on"]
    result = header("prefix", args, device) | {
        "model": args.model,
        "requests": requests,
        "system_tokens": system,
        "user_tokens": user,
        "new_tokens": new,
        "prefill_chunk": kw["prefill_chunk"],
        "prefill_graph_tokens": kw["prefill_graph_tokens"],
        "off": off,
        "on": on,
        "ttft_p50_speedup": off["ttft_ms"]["p50"] / on["ttft_ms"]["p50"],
        "throughput_speedup": on["tokens_per_s"] / off["tokens_per_s"],
        "tokens_equal": equal,
    }
    out = write_result(result, args.out, "prefix")
    _print(result, str(out))
    return 0 if equal else 1


def _print(result: dict[str, Any], out: str) -> None:
    table = Table(
        title=f"{result['model']}: {result['requests']} requests sharing {result['system_tokens']} tokens "
        f"(+{result['user_tokens']} own, {result['new_tokens']} new), prefix caching off vs on "
        f"({result['env']['device']})"
    )
    cols = (
        "caching",
        "TTFT p50 ms",
        "TTFT p90 ms",
        "steps to 1st",
        "wall s",
        "tokens/s",
        "prefilled",
        "hit rate",
    )
    for col in cols:
        table.add_column(col, justify="right")
    for key in ("off", "on"):
        m = result[key]
        rate = 1 - m["prefilled_tokens"] / m["prompt_tokens"]
        table.add_row(
            key,
            f"{m['ttft_ms']['p50']:.1f}",
            f"{m['ttft_ms']['p90']:.1f}",
            str(m["steps_to_first_token"]["max"]),
            f"{m['wall_s']:.2f}",
            f"{m['tokens_per_s']:.1f}",
            str(m["prefilled_tokens"]),
            f"{rate:.2f}",
        )
    table.caption = (
        f"TTFT p50 {result['ttft_p50_speedup']:.2f}x, throughput {result['throughput_speedup']:.2f}x; "
        f"tokens {'equal' if result['tokens_equal'] else 'DIFFER'}"
    )
    console = wide_console()
    console.print(table)
    console.print(f"written to {out}")
