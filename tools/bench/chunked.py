"""Chunked prefill on graphs: do running clients keep their pace while a long prompt arrives?

``python -m graphrt.tools.bench.chunked --model smollm2 --out bench/results/h200``: ``--clients``
requests decode (greedy, ``--client-tokens`` prompts); after ``--steady`` steps a
``--long``-token prompt arrives. Two engines built the same way but for ``prefill_chunk``
(``--chunk`` tokens per step vs whole prompts) run the same workload. Per engine: the clients'
inter-token latency (ITL: time between a client's consecutive tokens) p50 / p99 before the long
prompt and while it prefills (until its first token), the long prompt's time to first token,
and the MIXED graph replays (the unchunked engine's: its prefills that fit a prefill graph,
``EngineConfig.prefill_graph_tokens``, not a long prompt's). Issue 43's targets: with chunking the clients' p99 ITL while the
long prompt prefills stays within 2x its steady value; the long prompt's TTFT within 1.2x of
the unchunked engine's. The tokens of both engines are compared (``tokens_equal``).
JSON: ``<out>/chunked_<UTC time>.json``.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import numpy as np

from graphrt import Engine
from graphrt.tools.bench.device_ops import device_ops, kernel_breakdown
from graphrt.tools.bench.record import header, write_result
from graphrt.tools.cli.args import resolve_device


def percentiles(ms: list[float]) -> dict[str, float]:
    a = np.asarray(ms or [0.0])
    return {"p50": float(np.percentile(a, 50)), "p99": float(np.percentile(a, 99)), "n": len(ms)}


def measure(
    engine: Engine, clients: list[list[int]], long: list[int], args: argparse.Namespace
) -> dict[str, Any]:
    """Clients decode ``args.steady`` steps, then the long prompt arrives; ITL by phase, TTFT."""
    engine.generate([long[: args.chunk]], 2)  # NOTE: warm-up (first-touch allocations)
    before = engine.stats()
    budget = args.steady + args.long // args.chunk + args.after + 8
    ids = [engine.add_request(p, budget) for p in clients]
    last: dict[int, float] = {}
    itl: dict[str, list[float]] = {"steady": [], "during": []}
    long_id, arrived, first = -1, 0.0, None
    for step in range(budget):
        if step == args.steady:
            long_id, arrived = engine.add_request(long, args.after), time.perf_counter()
        produced = engine.step()
        now = time.perf_counter()
        for rid, _ in produced:
            if rid == long_id:
                first = now - arrived if first is None else first
            elif rid in last:
                # NOTE: "during": from the long prompt's arrival to its first token
                itl["during" if long_id >= 0 and first is None else "steady"].append((now - last[rid]) * 1e3)
            last[rid] = now
        if long_id in engine.finished:
            break
    for rid in ids:
        engine.abort(rid)
    stats = engine.stats()
    done = engine.finished.get(long_id)
    return {
        "itl_steady_ms": percentiles(itl["steady"]),
        "itl_during_prefill_ms": percentiles(itl["during"]),
        "long_ttft_ms": (first or 0.0) * 1e3,
        "mixed_replays": stats.replays.get("MIXED", 0) - before.replays.get("MIXED", 0),
        "mixed_steps": stats.mixed_steps - before.mixed_steps,
        "fallbacks": stats.fallbacks,
        "long_output": list(done.output) if done is not None else None,
    }


def profile_prefill(
    engine: Engine, clients: list[list[int]], long: list[int], args: argparse.Namespace
) -> Any:
    """The device's kernels per step (:func:`kernel_breakdown`) from the long prompt's arrival
    to its first token, the clients decoding: where a prefilling step's time goes."""
    ids = [engine.add_request(p, args.steady + len(long) // args.chunk + 16) for p in clients]
    for _ in range(4):
        engine.step()
    long_id, steps = engine.add_request(long, 2), 0
    with device_ops(engine.device) as ops:
        while steps < len(long) and not any(rid == long_id for rid, _ in engine.step()):
            steps += 1
    for rid in ids:
        engine.abort(rid)
    return kernel_breakdown(ops, steps + 1, top=args.profile)


def run(args: argparse.Namespace) -> dict[str, Any]:
    device = resolve_device(args.device)
    context = -(-(args.long + args.after + 16) // 16) * 16
    kw = {"device": device, "max_batch_size": args.clients + 1, "max_context_len": context}
    rng = np.random.default_rng(0)
    runs: dict[str, dict[str, Any]] = {}
    for key, chunk in (("whole", None), ("chunked", args.chunk)):
        engine = Engine(args.model, prefill_chunk=chunk, prefix_caching=False, **kw)
        vocab = engine.model.vocab_size
        clients = [rng.integers(0, vocab, args.client_tokens).tolist() for _ in range(args.clients)]
        long = np.random.default_rng(1).integers(0, vocab, args.long).tolist()
        runs[key] = measure(engine, clients, long, args)
        if args.profile:
            runs[key]["profile"] = profile_prefill(engine, clients, long[::-1], args)
        engine.close()
        del engine
    whole, chunked = runs["whole"], runs["chunked"]
    equal = whole.pop("long_output") == chunked.pop("long_output")
    steady = chunked["itl_steady_ms"]["p99"] or 1.0
    return header("chunked", args, device) | {
        "model": args.model,
        "whole": whole,
        "chunked": chunked,
        "chunked_p99_itl_ratio": chunked["itl_during_prefill_ms"]["p99"] / steady,
        "ttft_ratio_chunked_vs_whole": chunked["long_ttft_ms"] / max(whole["long_ttft_ms"], 1e-9),
        "tokens_equal": equal,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2")
    p.add_argument("--device", default="auto")
    p.add_argument("--clients", type=int, default=8, help="requests decoding when the long prompt arrives")
    p.add_argument("--client-tokens", type=int, default=32, help="each client's prompt")
    p.add_argument("--long", type=int, default=4000, help="the long prompt's tokens")
    p.add_argument("--chunk", type=int, default=512, help="prefill_chunk of the chunked engine")
    p.add_argument("--steady", type=int, default=32, help="decode steps before the long prompt arrives")
    p.add_argument("--after", type=int, default=8, help="tokens the long prompt generates")
    p.add_argument("--profile", type=int, default=0, help="and the top N kernels of a prefilling step (CUDA)")
    p.add_argument("--out", default="bench/results")
    args = p.parse_args(argv)
    result = run(args)
    path = write_result(result, args.out, "chunked")
    for key in ("whole", "chunked"):
        m = result[key]
        print(
            f"{key:8s} ITL p99 steady {m['itl_steady_ms']['p99']:.2f} ms, during prefill "
            f"{m['itl_during_prefill_ms']['p99']:.2f} ms; long TTFT {m['long_ttft_ms']:.1f} ms; "
            f"MIXED replays {m['mixed_replays']}"
        )
        prof = m.get("profile") or {}
        if prof.get("busy_us") is not None:
            print(f"  prefilling step: device busy {prof['busy_us']:.0f} us of {prof['span_us']:.0f} us span")
        for k in prof.get("kernels", []):
            print(f"  {k['us']:9.1f} us {k['launches']:6.1f}x {k['kernel']}")
    print(
        f"chunked p99 ITL ratio {result['chunked_p99_itl_ratio']:.2f} (target <= 2), TTFT ratio "
        f"{result['ttft_ratio_chunked_vs_whole']:.2f} (target <= 1.2), tokens "
        f"{'equal' if result['tokens_equal'] else 'DIFFER'}; written to {path}"
    )
    return 0 if result["tokens_equal"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
