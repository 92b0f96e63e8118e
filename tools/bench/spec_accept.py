"""``graphrt bench-spec --target MODEL``: the speculative engine end to end, chain and tree drafts.

Runs plain greedy decoding and the speculative engine for each ``--topk`` on the same prompts,
checks the tokens are equal, and reports acceptance (mean accepted length, the
fraction of verifies accepting each draft step) and decode throughput. Writes
``<out>/spec_accept_<device>_<UTC time>.json``.

Equality is exact in fp32: there a difference is a bug and the bench exits 1. In bf16 a near-tie
may flip between the verify's shapes and the decode's (different kernels, different rounding),
after which the two runs continue differently; each row then records how many requests match
plain greedy and where each other one first departs (``departures``: request, token index),
and the exit status stays 0.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import numpy as np
import torch
from rich.table import Table

from graphrt import Engine
from graphrt.tools.bench.record import header, write_result
from graphrt.tools.cli.args import resolve_device
from graphrt.tools.cli.console import wide_console


def _prompts(vocab: int, count: int, length: int) -> list[list[int]]:
    rng = np.random.default_rng(0)
    return [rng.integers(0, vocab, length).tolist() for _ in range(count)]


def _run(args: argparse.Namespace, speculative: dict[str, Any] | None) -> dict:
    engine = Engine(
        args.target,
        device=resolve_device(args.device),
        max_batch_size=max(args.batch_sizes),
        max_context_len=args.context,
        speculative=speculative,
        dtype={"bf16": torch.bfloat16, "fp32": torch.float32}.get(args.dtype),
    )
    prompts = _prompts(engine.model.vocab_size, max(args.batch_sizes), args.prompt_len)
    start = time.perf_counter()
    tokens = engine.generate(prompts, args.max_new_tokens)
    seconds = time.perf_counter() - start
    stats = engine.stats()
    engine.close()
    row = {"tokens": tokens, "seconds": seconds, "tokens_per_s": stats.generated_tokens / seconds}
    row["dtype"] = str(next(engine.model.parameters()).dtype).removeprefix("torch.")
    row |= {"decode_steps": stats.decode_steps, "fallbacks": stats.fallbacks}
    if speculative is not None:
        row |= {
            "mean_accept_length": stats.mean_accept_length,
            "acceptance_rate": stats.acceptance_rate,
            "acceptance_per_step": list(stats.acceptance_per_step),
        }
    return row


def run_bench_spec_accept(args: argparse.Namespace) -> int:
    """Plain greedy, then one speculative run per ``--topk``; exit 1 if any tokens differ."""
    plain = _run(args, None)
    rows = []
    for topk in args.topk:
        spec = {"draft_model": args.draft or args.target, "num_steps": args.num_steps, "topk": topk}
        row = _run(args, spec)
        row |= {"topk": topk, "num_steps": args.num_steps} | _agreement(row["tokens"], plain["tokens"])
        rows.append({k: v for k, v in row.items() if k != "tokens"})
    plain.pop("tokens")
    result = {**header("spec_accept", args, resolve_device(args.device)), "plain": plain, "rows": rows}
    out = write_result(result, args.out, f"spec_accept_{resolve_device(args.device).type}")
    _print(result, args)
    wide_console().print(f"written to {out}")
    exact = plain["dtype"] == "float32"
    return 0 if all(r["equal"] for r in rows) or not exact else 1


def _agreement(spec: list[list[int]], plain: list[list[int]]) -> dict[str, Any]:
    """Whether the speculative tokens equal plain greedy's; if not, where each request departs."""
    departures = [
        [i, next((j for j, (a, b) in enumerate(zip(s, p, strict=False)) if a != b), min(len(s), len(p)))]
        for i, (s, p) in enumerate(zip(spec, plain, strict=True))
        if s != p
    ]
    return {"equal": not departures, "requests_equal": len(spec) - len(departures), "departures": departures}


def _print(result: dict, args: argparse.Namespace) -> None:
    table = Table(title=f"speculative engine: {args.target} drafted by {args.draft or args.target}")
    for col in (
        "topk",
        "steps",
        "= greedy (requests)",
        "mean accepted",
        "per-step acceptance",
        "tok/s",
        "plain tok/s",
    ):
        table.add_column(col, justify="right", no_wrap=True)
    for r in result["rows"]:
        table.add_row(
            str(r["topk"]),
            str(r["num_steps"]),
            "yes" if r["equal"] else f"{r['requests_equal']}/{r['requests_equal'] + len(r['departures'])}",
            f"{r['mean_accept_length']:.2f}",
            " ".join(f"{a:.2f}" for a in r["acceptance_per_step"]),
            f"{r['tokens_per_s']:.1f}",
            f"{result['plain']['tokens_per_s']:.1f}",
        )
    wide_console().print(table)
