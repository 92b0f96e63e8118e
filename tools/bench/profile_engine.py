"""``python -m graphrt.tools.bench.profile_engine``: the engine's own host time per decode step.

Builds tiny-llama engines (the emulated graph engine on the CPU) and, per batch size and
overlap setting, times ``Engine.step()`` over a decode window with ``time.perf_counter_ns``
and the time spent inside ``GraphRuntime.run()`` (wrapped on the engine's runtime). The
engine's bookkeeping is ``step - run``: building batches, per-request loops, slot
allocation, stop checks, token appends, the overlap's device ops. ``--profile`` adds a
``cProfile`` of the window (top functions by own time, ``run()``'s callees included). A
second, untimed window counts the torch calls a step makes outside graph replays (each one a
driver call on a GPU host; the stub's own token tensor is not counted).

``--speculative ngram|suffix`` runs that proposer's engine (overlapped rounds) beside the plain
overlapped one; with ``--stub`` its steps' tokens never repeat, so every step backs off (a fed
DECODE, no drafts) and the two rows compare a backed-off step's host cost with a plain step's.
``--stub-repeat`` (a copy workload) makes the stub's tokens repeat each request's prompt (the
token at position ``p`` is ``prompt[p % len(prompt)]``), its verify rounds' too: every round
of a proposer's engine drafts and accepts all it offered, and the rows add the share of
drafted rounds, the tokens committed per step and the step's µs per committed token.
``--skip-replay`` (with ``--stub``) runs each decode step's ``run()`` (its checks, buffer
writes, KV ledger and token feed) but skips the graph replay, the stub's tokens written into
the output: the step column is then the whole host time of a step without the forward.

Prints µs p50 per step and writes nothing: a diagnostic, not a result.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from graphrt import Engine
from graphrt.engine.spec_layout import Round
from graphrt.tools.bench.profile_stub import PROMPT_IDS, RunTimer

WARMUP = 8
#: Steps of the untimed window that counts torch calls.
COUNTED = 10
TIMERS: dict[int, RunTimer] = {}  # NOTE: one per engine: its runtimes are wrapped once


@dataclass(frozen=True, slots=True)
class Stub:
    """How decode steps run: ``stub`` (a token, nothing run), ``fresh`` tokens (never repeat),
    ``skip`` the replays (``--skip-replay``), ``repeat`` the prompts (``--stub-repeat``)."""

    stub: bool = False
    fresh: bool = False
    skip: bool = False
    repeat: bool = False


def budget(steps: int, nodes: int) -> int:
    """New tokens per request: warm-up, timed and counted steps, each committing ``nodes``."""
    return (1 + WARMUP + steps + COUNTED + 2) * nodes


def measure(
    engine: Engine, bs: int, steps: int, rng: np.random.Generator, profile: int, stub: Stub, nodes: int = 1
) -> dict[str, float]:
    """Prefill ``bs`` prompts, warm up, time ``steps`` decode steps, finish every request.
    ``nodes``: the most tokens a step commits per request (the budget grows with it)."""
    prompts = [rng.integers(0, PROMPT_IDS, 16).tolist() for _ in range(bs)]
    for p in prompts:
        engine.add_request(p, budget(steps, nodes))
    timer = TIMERS.get(id(engine))
    if timer is None:
        timer = TIMERS[id(engine)] = RunTimer(engine)
    timer.stub, timer.fresh, timer.repeat = stub.stub, stub.fresh, stub.repeat  # NOTE: from the warm-up on
    timer.skip, timer.prompts = (
        stub.skip,
        {},
    )  # NOTE: from the warm-up on too: every step's KV is in the ledger
    for _ in range(1 + WARMUP):
        engine.step()
    if stub.skip:
        timer.skip_replays()  # NOTE: the warm-up captured the graphs
    r = timed(engine, timer, steps, profile)
    timer.pause_replays()
    timer.calls.n = 0
    with timer.calls:
        for _ in range(COUNTED):
            engine.step()
    r["torch_calls"] = timer.calls.n / COUNTED
    while engine.waiting or engine.running:
        engine.step()
    engine.step()
    return r


def timed(engine: Engine, timer: RunTimer, steps: int, profile: int) -> dict[str, float]:
    """Time ``steps`` engine steps: µs p50 of the step and of its host share (``step - run``),
    the share of steps that launched a verify round, tokens per step, and the step's µs p50
    per token (over the tokens per step)."""
    step_ns, host_ns, tokens, drafted = [], [], 0, 0
    prof = cProfile.Profile() if profile else None
    for _ in range(steps):
        timer.ns = 0
        if prof is not None:
            prof.enable()
        start = time.perf_counter_ns()
        produced = engine.step()
        took = time.perf_counter_ns() - start
        if prof is not None:
            prof.disable()
        step_ns.append(took)
        host_ns.append(took - timer.ns)
        tokens += len(produced)
        drafted += isinstance(engine.overlap.inflight if engine.overlap else None, Round)
    if prof is not None:
        out = io.StringIO()
        pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(profile)
        print(out.getvalue())
    return {
        "step_us": np.median(step_ns) / 1e3,
        "engine_us": np.median(host_ns) / 1e3,
        "drafted": drafted / steps,
        "tokens": tokens / steps,
        "token_us": np.median(step_ns) / 1e3 / max(tokens / steps, 1e-9),
    }


def settings(speculative: str | None, num_steps: int) -> list[tuple[str, dict[str, Any]]]:
    """``(name, engine keywords)`` per engine the run compares."""
    if speculative == "draft_model":
        return [("spec", {"speculative": {"num_steps": 3}})]
    if speculative:  # NOTE: a proposer beside the plain overlapped loop it must match
        options = {"method": speculative, "num_steps": num_steps}
        return [("on", {"overlap": True}), (speculative, {"speculative": options})]
    return [("off", {"overlap": False}), ("on", {"overlap": True})]


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-sizes", default="1,16,64")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--eager", action="store_true", help="no graphs (eager steps)")
    parser.add_argument(
        "--speculative",
        nargs="?",
        const="draft_model",
        choices=["draft_model", "ngram", "suffix"],
        help="draft_model (alone: a chain draft, 3 steps), or a proposer beside overlap on",
    )
    parser.add_argument("--num-steps", type=int, default=3, help="a proposer's drafts per round")
    parser.add_argument("--stub", action="store_true", help="decode steps return a token, run nothing")
    parser.add_argument(
        "--stub-repeat",
        action="store_true",
        help="with --stub: its tokens (verify rounds' too) repeat the prompts: every round drafts",
    )
    parser.add_argument(
        "--skip-replay", action="store_true", help="with --stub: run()'s host work, no graph replay"
    )
    parser.add_argument("--rounds", type=int, default=1, help="repeat the engines' rows, interleaved")
    parser.add_argument("--profile", type=int, default=0, help="cProfile: top N functions")
    args = parser.parse_args(argv)
    if args.skip_replay and (not args.stub or args.eager):
        parser.error("--skip-replay needs --stub and graphs (not --eager)")
    if args.stub_repeat and not args.stub:
        parser.error("--stub-repeat needs --stub")
    if args.num_steps < 1:
        parser.error(f"--num-steps must be >= 1, got {args.num_steps}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    sizes = [int(s) for s in args.batch_sizes.split(",")]
    proposer = args.speculative in ("ngram", "suffix")
    # NOTE: a copy workload's rounds commit up to num_steps + 1 tokens: the budget grows with them
    nodes = args.num_steps + 1 if proposer and args.stub_repeat else 1
    context = 16 + max(budget(args.steps, nodes), 1 + WARMUP + (args.steps + COUNTED) * 4) + nodes + 32
    kw: dict[str, Any] = {
        "device": "cpu",
        "buckets": sizes,
        "max_batch_size": max(sizes),
        "max_context_len": context,
        "use_graphs": not args.eager,
    }
    # NOTE: a proposer's stub steps take fresh tokens unless they repeat: it never matches,
    # every step backs off
    stub = Stub(args.stub, proposer and not args.stub_repeat, args.skip_replay, args.stub_repeat)
    engines = [
        (name, Engine("tiny-llama", **kw, **extra))
        for name, extra in settings(args.speculative, args.num_steps)
    ]
    rng = np.random.default_rng(0)
    head = f"{'bs':>4} {'overlap':>8} {'step µs p50':>12} {'engine µs p50 (step - run)':>28}"
    print(f"{head} {'torch calls/step':>17} {'drafted':>8} {'tokens/step':>12} {'step µs/token':>14}")
    for _ in range(args.rounds):
        for bs in sizes:
            for name, engine in engines:
                r = measure(engine, bs, args.steps, rng, args.profile, stub, nodes)
                row = f"{bs:>4} {name:>8} {r['step_us']:>12.1f} {r['engine_us']:>28.1f}"
                row += f" {r['torch_calls']:>17.1f} {r['drafted']:>8.2f}"
                print(f"{row} {r['tokens']:>12.2f} {r['token_us']:>14.1f}")
    for name, engine in engines:
        spec = engine.stats().speculation() if proposer and name == args.speculative else {}
        if spec:
            keys = ("verify_steps", "decode_steps", "no_match_rows", "paused_rows")
            print(f"{name}: " + ", ".join(f"{k} {spec.get(k, 0)}" for k in keys))
        engine.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
