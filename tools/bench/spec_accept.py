"""``graphrt bench-spec --target MODEL``: speculative decoding against the engine's fastest plain
loop, at the same batch size, in the same run.

For each ``--batch-sizes`` entry the plain engine (overlap on, as by default) and one
speculative engine per ``--method`` (``ngram``, ``suffix``: no draft model; ``draft_model``:
``--draft``, one run per ``--topk``) generate the same ``--workload`` prompts
(:mod:`.spec_workloads`). Each engine first runs an untimed warm-up generate (lazy kernel
loading, allocator, compilation inside an eager prefill: an earlier version timed each engine's
first generate), then ``--repeats`` timed ones; tokens/s is every generated token over the median
call's wall time (prefill included, the same prefill for both). Rows report the ratio to plain,
acceptance, tokens per round, the back-off counts and whether the tokens equal plain greedy
(exact in fp32; in bf16 a near-tie may flip between the verify's shapes and the decode's:
``departures`` says where). Writes
``<out>/spec_accept_<device>_<workload>_<UTC time>.json``; exits 1 when fp32 tokens differ.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from rich.table import Table

from graphrt import Engine
from graphrt.tools.bench.record import header, write_result
from graphrt.tools.bench.spec_workloads import AlwaysMatch, prompt_ids
from graphrt.tools.cli.args import resolve_device
from graphrt.tools.cli.console import wide_console

#: Tokens of the untimed warm-up generate.
WARMUP_TOKENS = 8


def _engine(
    args: argparse.Namespace, bs: int, speculative: dict[str, Any] | None, overlap: bool | None = None
) -> Engine:
    return Engine(
        args.target,
        overlap=overlap,
        device=resolve_device(args.device),
        max_batch_size=bs,
        max_context_len=args.context,
        speculative=speculative,
        dtype={"bf16": torch.bfloat16, "fp32": torch.float32}.get(args.dtype),
    )


def replay_us(engine: Engine, prompts: list[list[int]], max_new: int) -> dict[str, dict[str, float]]:
    """One more generate with the runtime's telemetry syncing after each replay: per mode, the
    replays' µs p50 of the host write (``update``), of ``graph.replay()`` on the host
    (``launch``: a CUDA graph's launch, the emulated engine's whole replay) and of the replay up
    to the sync (launch + device time), and their count. Untimed: the syncs serialise host and
    device."""
    telemetry = engine.runtime.telemetry
    before = sum(telemetry.batch_sizes.values())  # NOTE: the ring forgets, this count does not
    telemetry.sync = True
    try:
        engine.generate(prompts, max_new)
    finally:
        telemetry.sync = False
    steps = sum(telemetry.batch_sizes.values()) - before
    records = [r for r in telemetry.records[-steps:] if r.replay_us is not None] if steps else []
    out = {}
    for mode in sorted({r.mode for r in records}):
        mine = [r for r in records if r.mode == mode]
        out[mode] = {
            "update_us": float(np.median([r.update_us for r in mine])),
            "launch_us": float(np.median([r.launch_us for r in mine])),
            "replay_us": float(np.median([r.replay_us for r in mine])),
            "replays": len(mine),
        }
    return out


def _timed(engine: Engine, prompts: list[list[int]], max_new: int, repeats: int = 1) -> dict[str, Any]:
    """The warm-up, then ``repeats`` timed generates: the row's tokens/s is their median's (one
    generate's wall time varies from one to the next), each run's kept in ``runs_tokens_per_s``;
    ``steps`` is per generate."""
    engine.generate(prompts, WARMUP_TOKENS)
    before = engine.stats()
    runs = []
    for _ in range(repeats):
        start = time.perf_counter()
        tokens = engine.generate(prompts, max_new)
        runs.append((time.perf_counter() - start, tokens))
    stats = engine.stats()
    seconds, tokens = sorted(runs, key=lambda run: run[0])[len(runs) // 2]
    generated = sum(len(t) for t in tokens)
    row = {"tokens": tokens, "seconds": seconds, "tokens_per_s": generated / seconds}
    row["runs_tokens_per_s"] = [sum(len(t) for t in toks) / secs for secs, toks in runs]
    row |= {"steps": (stats.decode_steps - before.decode_steps) // repeats, "fallbacks": stats.fallbacks}
    row["dtype"] = str(next(engine.model.parameters()).dtype).removeprefix("torch.")
    # NOTE: the plain loop overlaps (its fastest); proposer chains overlap their rounds too
    row |= {"overlap": engine.overlap is not None, "spec_overlap": stats.spec_overlap}
    if engine.spec is not None:
        # NOTE: acceptance counts include the warm-up's few rounds
        row |= {
            "acceptance_rate": stats.acceptance_rate,
            "mean_accept_length": stats.mean_accept_length,
            "acceptance_per_step": list(stats.acceptance_per_step),
            "tokens_per_round": stats.tokens_per_round,
            "backoff": stats.backoff,
        }
    return row


def _specs(args: argparse.Namespace) -> list[dict[str, Any]]:
    """The speculative configurations of this run, one per method (and ``--topk`` for trees)."""
    out = []
    for method in args.method:
        common = {"method": method, "num_steps": args.num_steps}
        if method == "draft_model":
            out += [common | {"draft_model": args.draft or args.target, "topk": k} for k in args.topk]
        elif method == "suffix":
            out += [common | {"topk": k, "disable_batch_size": args.disable_batch_size} for k in args.topk]
        else:
            out.append(common | {"disable_batch_size": args.disable_batch_size})
    return out


def _batch_rows(args: argparse.Namespace, bs: int) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    plain_engine = _engine(args, bs, None)
    vocab = plain_engine.model.vocab_size
    prompts = prompt_ids(args.workload, args.target, vocab, bs, args.prompt_len, Path(args.prompts_dir))
    plain = _timed(plain_engine, prompts, args.max_new_tokens, args.repeats)
    if getattr(args, "replay_us", False):
        plain["replay_us"] = replay_us(plain_engine, prompts, args.max_new_tokens)
    plain_engine.close()
    rows = []
    known = {tuple(p): t for p, t in zip(prompts, plain["tokens"], strict=True)}
    modes = {"on": (None,), "off": (False,), "both": (None, False)}[getattr(args, "spec_overlap", "on")]
    for spec, overlap in ((s, o) for s in _specs(args) for o in modes):
        if args.workload == "always-match":
            spec = {k: v for k, v in spec.items() if k != "disable_batch_size"} | {"method": "ngram"}
        engine = _engine(args, bs, spec, overlap)
        if args.workload == "always-match":
            # NOTE: the bench's proposer replaces the runner's factory (made at each admission)
            engine.spec.make = lambda _options: AlwaysMatch(known, args.num_steps)  # type: ignore[union-attr]
        row = _timed(engine, prompts, args.max_new_tokens, args.repeats)
        if getattr(args, "replay_us", False):
            row["replay_us"] = replay_us(engine, prompts, args.max_new_tokens)
        engine.close()
        row |= {"batch_size": bs, "spec": spec, "plain_tokens_per_s": plain["tokens_per_s"]}
        row |= {"ratio": row["tokens_per_s"] / plain["tokens_per_s"]} | _agreement(
            row["tokens"], plain["tokens"]
        )
        rows.append({k: v for k, v in row.items() if k != "tokens"})
    plain = {k: v for k, v in plain.items() if k != "tokens"} | {"batch_size": bs}
    return plain, rows


def run_bench_spec_accept(args: argparse.Namespace) -> int:
    """Plain, then each speculative configuration, per batch size; exit 1 if fp32 tokens differ."""
    device = resolve_device(args.device)
    plains, rows = [], []
    for bs in args.batch_sizes:
        plain, spec_rows = _batch_rows(args, bs)
        plains.append(plain)
        rows += spec_rows
    result = {**header("spec_accept", args, device), "plain": plains, "rows": rows}
    out = write_result(result, args.out, f"spec_accept_{device.type}_{args.workload}")
    _print(result, args)
    wide_console().print(f"written to {out}")
    exact = all(p["dtype"] == "float32" for p in plains)
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
    table = Table(title=f"speculative vs plain (overlap on): {args.target}, workload {args.workload}")
    cols = (
        "bs",
        "method",
        "topk",
        "overlap",
        "= greedy",
        "accept",
        "tok/round",
        "backed off",
        "stale",
        "tok/s",
        "plain",
        "ratio",
    )
    for col in cols:
        table.add_column(col, justify="right", no_wrap=True)
    for r in result["rows"]:
        off = r["backoff"].get("decode_steps", 0) if r["backoff"] else 0
        table.add_row(
            str(r["batch_size"]),
            r["spec"]["method"],
            str(r["spec"].get("topk", 1)),
            "yes" if r.get("spec_overlap") else "no",
            "yes" if r["equal"] else f"{r['requests_equal']}/{r['requests_equal'] + len(r['departures'])}",
            f"{r['acceptance_rate']:.2f}",
            f"{r['tokens_per_round']:.2f}",
            f"{off}/{r['steps']}",
            str(r["backoff"].get("stale_rows", 0) if r["backoff"] else 0),
            f"{r['tokens_per_s']:.1f}",
            f"{r['plain_tokens_per_s']:.1f}",
            f"{r['ratio']:.2f}x",
        )
    wide_console().print(table)
    for name, r in [(f"plain bs {p['batch_size']}", p) for p in result["plain"]] + [
        (f"{r['spec']['method']} bs {r['batch_size']} overlap {r.get('spec_overlap')}", r)
        for r in result["rows"]
    ]:
        if r.get("replay_us"):
            modes = ", ".join(
                f"{m} {t['replay_us']:.0f} µs (write {t['update_us']:.0f}, launch {t['launch_us']:.0f}, "
                f"n {t['replays']})"
                for m, t in r["replay_us"].items()
            )
            wide_console().print(f"replay µs p50, {name}: {modes}")
