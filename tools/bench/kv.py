"""``graphrt bench model --kv-cache-dtype fp8_e4m3``: graphrt's decode step over an FP8 KV cache
against the same step over the model's own (bf16) KV, in one process on the same inputs.

Per batch size, on the same random weights (``tools/bench/model_twin.py``), prompts (every request
holds ``--context`` tokens) and next tokens, two stacks are built one after the other (the first
freed before the second, so the model is loaded once and the two caches never coexist): each
prefilled, its DECODE graphs captured, timed (``runtime.run(batch)`` to logits) and profiled.
Each row's floor adds the KV bytes the step reads *in that cache's dtype* to the weight bytes.

A cache that does not fit the device's free memory (its bytes plus a prefill's transient
logits, :func:`need_bytes`) is recorded as skipped with the numbers, not attempted: an 8B
model at bs 64 and 8k context needs 68.7 GB of bf16 KV (+ 16 GB of weights: not an 80 GB H100)
and 34.4 GB of FP8. Before the timings are compared the FP8 step's logits are checked against
bf16's (relative L2 ≤ :data:`FP8_TOLERANCE`; top-1 agreement reported): the same computation,
up to FP8 rounding. Each run writes ``<out>/kv_<device>_<shape>_<UTC time>.json``.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import torch
from rich.table import Table

from graphrt.checkpoints.loader import default_dtype
from graphrt.engine.stack import mha_kv_dtype
from graphrt.kv.paged import KVShape, token_bytes
from graphrt.tools.bench import model_steps as steps
from graphrt.tools.bench.model import measure_graphrt, resolve_shape
from graphrt.tools.bench.model_twin import compare, random_llama, require, step_read_bytes, weight_bytes
from graphrt.tools.bench.record import fmt_us, header, write_result
from graphrt.tools.cli.args import resolve_backend, resolve_device
from graphrt.tools.cli.console import bench_progress, wide_console

#: Relative L2 error of the FP8-KV step's logits against the bf16-KV step's: FP8 keeps 3
#: mantissa bits of K, V and q (~3% per element), averaged over every key the softmax weighs;
#: a wrong scale or layout gives ~100%. A sanity bound, not a quality claim (that is
#: ``tools/bench/kv_agreement.py``'s SmolLM2 top-1 agreement).
FP8_TOLERANCE = 0.1
#: Device memory kept free beside a cache: graph pools, activations, the allocator's slack.
SLACK_BYTES = 2 << 30


def need_bytes(kv_bytes: int, context: int, vocab: int) -> int:
    """Device bytes a stack needs beyond the weights: its cache, one prefill's ``[context,
    vocab]`` logits (bf16 then fp32: 6 bytes a logit) and :data:`SLACK_BYTES`."""
    return kv_bytes + 6 * context * vocab + SLACK_BYTES


def _free_bytes(device: torch.device) -> int | None:
    return torch.cuda.mem_get_info(device)[0] if device.type == "cuda" else None


def _measure_kv(run: dict[str, Any], kv: str) -> dict[str, Any]:
    """Build, prefill, capture and time the stack with a ``kv`` cache, then free it."""
    model, sizes, context = run["model"], run["sizes"], run["context"]
    stack, report = steps.graphrt_stack(model, sizes, context, run["backend"], kv)
    try:
        steps.graphrt_prefill(stack, run["prompts"].numpy())
        rows, logits = {}, {}
        for bs in sizes:
            row, logits[bs] = measure_graphrt({**run, "stack": stack, "report": report}, bs)
            row["kv_read_bytes"] = bs * (context + 1) * stack.kv.bytes_per_token
            rate = run["floor"]["bandwidth_gb_s"] * 1e9
            row["floor_with_kv_us"] = (run["read_bytes"] + row["kv_read_bytes"]) / rate * 1e6
            rows[bs] = row
        facts = {
            "kv_dtype": str(stack.kv.dtype).removeprefix("torch."),
            "kv_bytes": stack.kv.nbytes,
            "bytes_per_token": stack.kv.bytes_per_token,
            "backend": stack.runtime.backend.name,
            "engine": report.engine,
            "capture_s": report.seconds,
        }
        return {"facts": facts, "rows": rows, "logits": logits}
    finally:
        stack.runtime.release()
        del stack
        if run["device"].type == "cuda":
            torch.cuda.empty_cache()


def _skip(run: dict[str, Any], kv: str) -> dict[str, Any] | None:
    """Why the ``kv`` stack is not built (it would not fit), or None."""
    free, cfg = _free_bytes(run["device"]), run["cfg"]
    shape = KVShape(
        cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, 1, max(run["sizes"]) * steps.capacity(run["context"])
    )
    need = need_bytes(
        token_bytes(shape, mha_kv_dtype(kv, run["dtype"])) * shape.num_pages, run["context"], cfg.vocab_size
    )
    if free is None or need <= free:
        return None
    why = f"needs {need / 1e9:.1f} GB beside the weights, {free / 1e9:.1f} GB free"
    return {"skipped": why, "need_bytes": need}


def _rows(run: dict[str, Any], measured: dict[str, dict[str, Any]], kv: str) -> list[dict[str, Any]]:
    """Per batch size: both caches' timings, the FP8 / bf16 ratios and the logits' agreement."""
    out = []
    for bs in run["sizes"]:
        row: dict[str, Any] = {"bs": bs}
        for name, m in measured.items():
            row[name] = m["rows"][bs] if "rows" in m else None
        base, fp8 = row["auto"], row[kv]
        if base and fp8:
            parity = compare(
                measured[kv]["logits"][bs], measured["auto"]["logits"][bs], run["dtype"], FP8_TOLERANCE
            )
            require(parity, f"bs {bs}: FP8 KV vs the model's KV")
            row["parity"] = parity.as_dict()
            row["fp8_over_bf16"] = fp8["graphrt_us"]["p50"] / base["graphrt_us"]["p50"]
            spans = fp8["device"]["span_us"], base["device"]["span_us"]
            row["device_fp8_over_bf16"] = spans[0] / spans[1] if all(spans) else None
        out.append(row)
    return out


def run_kv_compare(args: argparse.Namespace) -> int:
    """Time graphrt's decode step over ``args.kv_cache_dtype`` KV and over the model's (bf16 on
    CUDA) KV; write the JSON, print a table."""
    start = time.perf_counter()
    device = resolve_device(args.device)
    name, cfg = resolve_shape(args.shape, device)
    dtype, sizes = default_dtype(device), sorted(set(args.batch_sizes))
    run: dict[str, Any] = {
        "device": device, "name": name, "cfg": cfg, "dtype": dtype, "sizes": sizes, "context": args.context, "iters": args.iters,
        "backend": resolve_backend(args.backend, device, name),
    }  # fmt: skip
    with torch.no_grad():
        run["model"] = random_llama(cfg, device, dtype, seed=0)
        run["read_bytes"] = step_read_bytes(run["model"])
        run["floor"] = steps.weight_floor(run["read_bytes"], device, args.iters)
        gen = torch.Generator().manual_seed(0)
        run["prompts"] = torch.randint(cfg.vocab_size, (max(sizes), args.context), generator=gen)
        run["next_ids"] = torch.randint(cfg.vocab_size, (max(sizes),), generator=gen)
        measured: dict[str, dict[str, Any]] = {}
        with bench_progress() as progress:
            task = progress.add_task("kv", total=2)
            for kv in ("auto", args.kv_cache_dtype):
                progress.update(task, description=f"{kv} KV")
                measured[kv] = _skip(run, kv) or _measure_kv(run, kv)
                progress.advance(task)
        rows = _rows(run, measured, args.kv_cache_dtype)
    result = {
        **header("model_decode_kv", args, device),
        "shape": name,
        "dtype": str(dtype).removeprefix("torch."),
        "context": args.context,
        "kv_capacity": steps.capacity(args.context),
        "weight_bytes": weight_bytes(run["model"]),
        "read_bytes": run["read_bytes"],
        "floor": run["floor"],
        "caches": {k: m.get("facts") or _skipped(m) for k, m in measured.items()},
        "parity_check": {
            "metric": "relative L2 of FP8-KV logits vs bf16-KV logits",
            "tolerance": FP8_TOLERANCE,
        },
        "seconds": time.perf_counter() - start,
        "rows": rows,
    }
    out = write_result(result, args.out, f"kv_{device.type}_{name}")
    print_kv_table(result, out, args.kv_cache_dtype)
    return 0


def _skipped(measured: dict[str, Any]) -> dict[str, Any]:
    return {"skipped": measured["skipped"], "need_bytes": measured["need_bytes"]}


def _cell(row: dict[str, Any] | None, key: str) -> str:
    if row is None:
        return "skipped"
    value = row[key] if key != "span" else row["device"]["span_us"]
    return fmt_us(value) if isinstance(value, dict) else (f"{value:.0f}" if value else "—")


def print_kv_table(result: dict[str, Any], out: Any, kv: str) -> None:
    """The rows as a rich table: each cache's step (run() and device), ratios, agreement."""
    table = Table(
        title=f"decode step, {result['shape']} ({result['dtype']}), context {result['context']}: "
        f"{kv} KV vs {result['dtype']} KV — {result['env']['device']}"
    )
    base = f"{result['dtype']} KV"
    for col in (
        "bs",
        f"{base} µs",
        "device µs",
        f"{kv} µs",
        "device µs",
        f"{kv} / {base}",
        "device",
        "rel L2",
        "top-1",
    ):
        table.add_column(col, justify="right", no_wrap=True)
    for r in result["rows"]:
        p = r.get("parity")
        table.add_row(
            str(r["bs"]),
            _cell(r["auto"], "graphrt_us"),
            _cell(r["auto"], "span"),
            _cell(r[kv], "graphrt_us"),
            _cell(r[kv], "span"),
            f"{r['fp8_over_bf16']:.2f}x" if p else "—",
            f"{r['device_fp8_over_bf16']:.2f}x" if p and r["device_fp8_over_bf16"] else "—",
            f"{p['rel_l2']:.3g}" if p else "—",
            f"{p['top1_agree']:.0%}" if p else "—",
        )
    caches = "; ".join(
        f"{k}: {c['kv_bytes'] / 1e9:.2f} GB ({c['bytes_per_token']} B/token)"
        if "kv_bytes" in c
        else f"{k}: {c['skipped']}"
        for k, c in result["caches"].items()
    )
    table.caption = (
        f"µs: p50 (p10–p90) run() to logits; device µs: profiled replays back to back; KV {caches}"
    )
    console = wide_console()
    console.print(table)
    console.print(f"{result['seconds']:.0f} s in all; written to {out}")
