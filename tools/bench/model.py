"""``graphrt bench model``: a whole model's decode step, graphrt against the weight-read floor and
transformers, in one process on the same inputs.

Per batch size, on the same random weights (``tools/bench/model_twin.py``), the same prompts (every
request holds ``--context`` tokens) and the same next token:

- graphrt: graphed DECODE through the normal stack (``stack_for`` → ``GraphRuntime``; FA3 on
  CUDA), timed from ``runtime.run(batch)`` to its logits being ready, as ``graphrt bench``;
- the floor: the weights a step reads, read once at the copy bandwidth measured here
  (``model_steps.FLOOR_DEFINITION``);
- transformers ``LlamaForCausalLM`` over a ``StaticCache``, eager and under
  ``torch.compile(mode="reduce-overhead", dynamic=False)``.

On CUDA, five graphrt replays per batch size also run under ``torch.profiler`` (CUDA activity
only): the row's ``device`` holds the busy and idle µs per step, the launches per step and the
top kernels by time; ``graph_nodes`` counts the nodes of the batch size's captured graph and
``pdl_edges`` its programmatic (PDL) edges (read through ``cuda.bindings``; null without it).
``GRAPHRT_PDL=0`` / ``GRAPHRT_PDL=0`` measure the same with PDL off
(``pdl_switches`` records them).

Before timing a batch size the bench checks that graphrt's logits match transformers' (and the
compiled model's) within ``model_twin.PARITY_TOLERANCE``, and raises ``ParityError`` if not.
Each run writes ``<out>/model_<device>_<shape>_<UTC time>.json``.

``--kv-cache-dtype fp8_e4m3`` times graphrt with an FP8 KV cache against graphrt with the model's
(bf16) KV instead (``tools/bench/kv.py``).
"""

from __future__ import annotations

import argparse
import importlib
import time
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

import torch

from graphrt import ForwardMode
from graphrt.checkpoints.loader import default_dtype
from graphrt.kernels import skinny
from graphrt.models.presets import LlamaConfig, preset
from graphrt.tools.bench import anchors
from graphrt.tools.bench import model_steps as steps
from graphrt.tools.bench.device_ops import profile_steps
from graphrt.tools.bench.model_moe import moe_shape, run_bench_moe
from graphrt.tools.bench.model_table import PROFILE_STEPS, print_table
from graphrt.tools.bench.model_twin import (
    PARITY_METRIC,
    PARITY_TOLERANCE,
    compare,
    hf_twin,
    random_llama,
    require,
    step_read_bytes,
    weight_bytes,
)
from graphrt.tools.bench.record import header, percentiles, time_us, write_result
from graphrt.tools.cli.args import UsageError, resolve_backend, resolve_device
from graphrt.tools.cli.console import bench_progress

#: ``--shape`` when none is given: the real size on a GPU, a tiny one on the CPU.
DEFAULT_SHAPE = {"cuda": "llama-3-8b", "cpu": "tiny-llama"}


def resolve_shape(value: str | None, device: torch.device) -> tuple[str, LlamaConfig]:
    """The preset ``--shape`` names (a full-attention Llama), or the device's default."""
    name = value or DEFAULT_SHAPE.get(device.type, "tiny-llama")
    try:
        cfg = preset(name)
    except ValueError as err:
        raise UsageError("--shape", name, "is not a preset; " + str(err).split("; ", 1)[-1]) from None
    if not isinstance(cfg, LlamaConfig) or cfg.sliding_window or cfg.attention_chunk_size:
        raise UsageError("--shape", name, "is not a full-attention Llama preset")
    return name, cfg


def _kv_read_bytes(cfg: LlamaConfig, bs: int, context: int, itemsize: int) -> int:
    """K and V bytes one decode step reads: ``bs`` rows of ``context + 1`` keys in every layer."""
    return bs * (context + 1) * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * 2 * itemsize


def measure_graphrt(run: dict[str, Any], bs: int) -> tuple[dict[str, Any], torch.Tensor]:
    """graphrt's step time for ``bs``, and its logits ``[bs, vocab]`` (the parity reference)."""
    device, context, iters, stack = run["device"], run["context"], run["iters"], run["stack"]
    batch = steps.graphrt_decode(stack, run["next_ids"][:bs].numpy(), context)
    ours = stack.runtime.run(batch).float().clone()
    row = {"bs": bs, "graphrt_us": percentiles(time_us(lambda: stack.runtime.run(batch), iters, device))}
    # NOTE: run()'s host time to its return (launch included, device idle at the start), and
    # the step timed by events over PROFILE_STEPS calls back to back: together they tell what of
    # graphrt_us - the device span is the host's (8B bs 64 left 360-518 µs between the two)
    row["host_us"] = percentiles(time_us(lambda: stack.runtime.run(batch), iters, device, host_only=True))
    steady = time_us(lambda: [stack.runtime.run(batch) for _ in range(PROFILE_STEPS)], iters, device)
    row["steady_us"] = percentiles([us / PROFILE_STEPS for us in steady])
    row["device"] = profile_steps(lambda: stack.runtime.run(batch), device, PROFILE_STEPS)
    info = next(g for g in run["report"].graphs if g.key == (ForwardMode.DECODE, bs))
    # NOTE: from the graph's topology (cuda.bindings), kernel recording off; None: not read
    row["graph_nodes"], row["pdl_edges"] = info.num_nodes, info.programmatic_edges
    if run.get("det_stack") is not None:  # NOTE: --deterministic: the same step, batch-invariant
        row |= steps.deterministic_row(run["det_stack"], run["next_ids"][:bs].numpy(), context, iters, ours)
        row["deterministic_cost"] = row["deterministic_us"]["p50"] / row["graphrt_us"]["p50"]
    return row, ours


def _measure_theirs(run: dict[str, Any], row: dict[str, Any], ours: torch.Tensor) -> dict[str, Any]:
    """transformers eager and compiled at ``row["bs"]``, each checked against ``ours`` first."""
    device, dtype, context, iters, tol = run["device"], run["dtype"], run["context"], run["iters"], run["tol"]
    bs = row["bs"]
    cache = steps.hf_prefill(run["hf"], run["prompts"][:bs].to(device), steps.capacity(context))
    ids = run["next_ids"][:bs].to(device)
    eager = steps.hf_step(run["hf"].forward, cache, ids, context)
    parity: dict[str, Any] = {"transformers": compare(ours, eager.logits(), dtype, tol)}
    require(parity["transformers"], f"bs {bs}: graphrt vs transformers (eager)")
    row |= {
        "hf_eager_us": percentiles(time_us(eager, iters, device, setup=eager.rewind)),
        "hf_compiled_us": None,
        "compile_s": None,
        "compile_skipped": run["compile_skip"],
    }
    budget: steps.CompileBudget = run["budget"]
    if run["compiled"] is not None and not budget.allows():
        row["compile_skipped"] = f"compile budget {budget.budget_s:.0f} s spent ({budget.spent_s:.0f} s)"
    elif run["compiled"] is not None:
        fast = steps.hf_step(run["compiled"], cache, ids, context)
        row["compile_s"] = steps.time_first_call(fast, device)
        budget.add(row["compile_s"])
        parity["transformers_compiled"] = compare(ours, fast.logits(), dtype, tol)
        require(parity["transformers_compiled"], f"bs {bs}: graphrt vs transformers (compiled)")
        row["hf_compiled_us"] = percentiles(time_us(fast, iters, device, setup=fast.rewind))
    row["parity"] = {k: p.as_dict() for k, p in parity.items()}
    return _ratios(row, run, bs)


def _ratios(row: dict[str, Any], run: dict[str, Any], bs: int) -> dict[str, Any]:
    floor = run["floor"]
    ours = row["graphrt_us"]["p50"]
    kv = _kv_read_bytes(run["cfg"], bs, run["context"], run["itemsize"])
    row["kv_read_bytes"] = kv
    row["floor_with_kv_us"] = (run["read_bytes"] + kv) / (floor["bandwidth_gb_s"] * 1e9) * 1e6
    row["over_floor"] = ours / floor["floor_us"]
    span = row["device"]["span_us"]
    # NOTE: the device's own step time (replays back to back): what an engine that overlaps
    # its host work (``Engine(overlap=True)``) pays per step; ``graphrt_us`` also holds run()'s host path.
    row["device_over_floor"] = span / floor["floor_us"] if span else None
    device = run["device"]
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else device.type
    row |= anchors.compare(run["name"], bs, name, ours, row["over_floor"])
    row["hf_eager_over_graphrt"] = row["hf_eager_us"]["p50"] / ours
    compiled = row["hf_compiled_us"]
    row["hf_compiled_over_graphrt"] = compiled["p50"] / ours if compiled else None
    return row


def _setup(args: argparse.Namespace, say: Callable[[str], None]) -> dict[str, Any]:
    """Model, floor, graphrt stack (captured, prefilled), transformers twin, inputs; ``say``
    names each phase as it starts."""
    device = resolve_device(args.device)
    name, cfg = resolve_shape(args.shape, device)
    backend = resolve_backend(args.backend, device, name)
    dtype, sizes, context = default_dtype(device), sorted(set(args.batch_sizes)), args.context
    say(f"random {name} weights")
    model = random_llama(cfg, device, dtype, seed=0)
    read = step_read_bytes(model)
    say("weight-read floor")
    floor = steps.weight_floor(read, device, args.iters)
    say(f"capture bs {','.join(map(str, sizes))}")
    stack, report = steps.graphrt_stack(model, sizes, context, backend)
    gen = torch.Generator().manual_seed(0)
    prompts = torch.randint(cfg.vocab_size, (max(sizes), context), generator=gen)
    next_ids = torch.randint(cfg.vocab_size, (max(sizes),), generator=gen)
    say(f"prefill {max(sizes)} x {context} tokens")
    steps.graphrt_prefill(stack, prompts.numpy())
    det = steps.deterministic_stack(model, sizes, context, backend, prompts) if args.deterministic else None
    skip = steps.compile_skip_reason(args, device)
    say("transformers twin")
    hf = hf_twin(model, steps.capacity(context))
    return {
        "device": device, "name": name, "cfg": cfg, "dtype": dtype, "itemsize": dtype.itemsize,
        "sizes": sizes, "context": context, "iters": args.iters, "model": model, "stack": stack,
        "report": report, "hf": hf, "floor": floor, "read_bytes": read, "prompts": prompts,
        "next_ids": next_ids, "compile_skip": skip, "tol": args.parity_tol or PARITY_TOLERANCE[dtype],
        "compiled": None if skip else steps.compiled_forward(hf),
        "budget": steps.CompileBudget(args.compile_budget), "det_stack": det,
    }  # fmt: skip


#: Flags that make ``bench model`` a comparison of its own: (flag, its plain value, "module:function").
VARIANTS = (
    ("quantization", None, "graphrt.tools.bench.quant:run_quant_compare"),
    ("kv_cache_dtype", "auto", "graphrt.tools.bench.kv:run_kv_compare"),
)


def run_bench_model(args: argparse.Namespace) -> int:
    """``graphrt bench model``: writes a new result file under ``args.out`` and prints its table."""
    for flag, plain, target in VARIANTS:
        if getattr(args, flag, plain) != plain:
            module, name = target.split(":")  # NOTE: imported here: those modules import this one
            return getattr(importlib.import_module(module), name)(args)
    moe = moe_shape(args.shape)
    if moe is not None:
        return run_bench_moe(args, args.shape, moe)
    start = time.perf_counter()
    with torch.no_grad(), bench_progress() as progress:
        setup = progress.add_task("setup", total=None)
        run = _setup(args, lambda what: progress.update(setup, description=what))
        progress.update(setup, description="setup done", total=1, completed=1)
        rows = []
        task = progress.add_task("model", total=len(run["sizes"]))
        # NOTE: graphrt first at every bs, transformers after: Inductor's CUDA graph trees
        # clear cuBLAS's workspaces when they record, and a graphrt replay after that died
        # with an illegal memory access on the H200 (graphs bake the workspace's address).
        ours = [measure_graphrt(run, bs) for bs in run["sizes"]]
        for row, logits in ours:
            progress.update(task, description=f"bs={row['bs']}")
            rows.append(_measure_theirs(run, row, logits))
            progress.console.print(_line(rows[-1]))  # NOTE: survives a run cut by a timeout
            progress.advance(task)
    result = _result(args, run, rows, time.perf_counter() - start)
    out = write_result(result, args.out, f"model_{run['device'].type}_{run['name']}")
    print_table(result, out)
    return 0


def _line(row: dict[str, Any]) -> str:
    """One finished batch size as a log line (p50s)."""
    compiled = row["hf_compiled_us"]
    return (
        f"bs {row['bs']}: graphrt {row['graphrt_us']['p50']:.0f} µs ({row['over_floor']:.2f}x floor; "
        f"host {row['host_us']['p50']:.0f} µs, back to back {row['steady_us']['p50']:.0f} µs), "
        f"transformers {row['hf_eager_us']['p50']:.0f} µs, compiled "
        + (f"{compiled['p50']:.0f} µs (compile {row['compile_s']:.0f} s)" if compiled else "skipped")
        + (f"; deterministic {row['deterministic_cost']:.2f}x" if "deterministic_cost" in row else "")
    )


def _result(args: argparse.Namespace, run: dict[str, Any], rows: list, seconds: float) -> dict[str, Any]:
    device, report, stats = run["device"], run["report"], run["stack"].runtime.stats()
    return {
        **header("model_decode", args, device),
        "shape": run["name"],
        "config": asdict(run["cfg"]),
        "dtype": str(run["dtype"]).removeprefix("torch."),
        "context": run["context"],
        "kv_capacity": steps.capacity(run["context"]),
        "iters": run["iters"],
        "timer": "cuda events" if device.type == "cuda" else "perf_counter",
        "backend": run["stack"].runtime.backend.name,
        "engine": report.engine,
        "graphs": {
            "buckets": list(run["stack"].runtime.dispatcher.policy.buckets),
            "seconds": report.seconds,
            # NOTE: per graph, the capture split the targets are stated in
            "per_graph": [
                {
                    "key": str(g.key),
                    "warmup_s": g.warmup_seconds,
                    "capture_s": g.capture_seconds,
                    "instantiate_s": g.instantiate_seconds,
                    "pool_bytes": g.pool_bytes,
                    "nodes": g.num_nodes,
                    "pdl_edges": g.programmatic_edges,
                }
                for g in report.graphs
            ],
        },
        # NOTE: what tells a PDL-on run from a PDL-off one (the switches' values, "1" = on)
        "pdl_switch": {skinny.PDL_ENV: report.switches[skinny.PDL_ENV]},
        "switches": report.switches,
        "graph_replays": stats.replays.get("DECODE", 0),
        "eager_fallbacks": stats.fallbacks.get("DECODE", {}),
        "weight_bytes": weight_bytes(run["model"]),
        "read_bytes": run["read_bytes"],
        "floor": run["floor"],
        "parity_check": {"metric": PARITY_METRIC, "tolerance": run["tol"], "passed": True},
        "compile": {
            "mode": "reduce-overhead",
            "dynamic": False,
            "budget_s": run["budget"].budget_s,
            "spent_s": run["budget"].spent_s,
            "cudagraph_skips": steps.cudagraph_skips(),
        },
        "seconds": seconds,
        "rows": rows,
    }
