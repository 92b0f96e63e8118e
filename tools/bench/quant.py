"""``graphrt bench model --quantization fp8``: graphrt's decode step with FP8 weights against the
same step with the model's (bf16) weights, in one process on the same inputs.

The bf16 stack is built, prefilled, captured, timed and freed first; then the same model's
projections are quantized in place (:func:`graphrt.models.quantize.quantize`) and the FP8 stack
is measured the same way. Each variant's floor is the bytes its step reads (FP8 projections at
one byte a weight plus their scales) at the copy bandwidth measured here. Before the timings are
compared the FP8 step's logits are checked against bf16's (relative L2 <= :data:`TOLERANCE`; a
wrong scale or layout gives ~100%). Each run writes ``<out>/quant_<device>_<shape>_<UTC>.json``.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import torch

from graphrt.checkpoints.loader import default_dtype
from graphrt.models.quantize import quantize
from graphrt.tools.bench import model_steps as steps
from graphrt.tools.bench.kv import _measure_kv
from graphrt.tools.bench.model import resolve_shape
from graphrt.tools.bench.model_twin import compare, random_llama, require, step_read_bytes
from graphrt.tools.bench.record import header, write_result
from graphrt.tools.cli.args import resolve_backend, resolve_device

#: Relative L2 of the FP8 step's logits against bf16's: e4m3 keeps 3 mantissa bits per weight.
#: A sanity bound, not a quality claim (``bench kv-agreement``-style top-1 agreement is that).
TOLERANCE = 0.3


def _variant(run: dict[str, Any], name: str) -> dict[str, Any]:
    """Measure the model as it is now (bf16 or quantized): floor, then every batch size."""
    run["read_bytes"] = step_read_bytes(run["model"]) + _buffer_bytes(run["model"])
    run["floor"] = steps.weight_floor(run["read_bytes"], run["device"], run["iters"])
    measured = _measure_kv(run, "auto")
    for row in measured["rows"].values():
        row["floor_us"] = run["read_bytes"] / (run["floor"]["bandwidth_gb_s"] * 1e9) * 1e6
        row["over_floor"] = row["graphrt_us"]["p50"] / row["floor_us"]
    measured["facts"] |= {"weights": name, "read_bytes": run["read_bytes"], "floor": run["floor"]}
    return measured


def _buffer_bytes(model: torch.nn.Module) -> int:
    """Bytes of the FP8 scales a step reads (registered as buffers beside the weights)."""
    return sum(b.numel() * b.element_size() for n, b in model.named_buffers() if n.endswith("weight_scale"))


def _rows(run: dict[str, Any], base: dict[str, Any], fp8: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for bs in run["sizes"]:
        b, f = base["rows"][bs], fp8["rows"][bs]
        parity = compare(fp8["logits"][bs], base["logits"][bs], run["dtype"], TOLERANCE)
        require(parity, f"bs {bs}: FP8 weights vs bf16 weights")
        out.append(
            {
                "bs": bs,
                "bf16": b,
                "fp8": f,
                "parity": parity.as_dict(),
                "fp8_over_bf16": f["graphrt_us"]["p50"] / b["graphrt_us"]["p50"],
                "steady_fp8_over_bf16": f["steady_us"]["p50"] / b["steady_us"]["p50"],
            }
        )
    return out


def run_quant_compare(args: argparse.Namespace) -> int:
    """Time graphrt's decode step with bf16 weights, then FP8 weights; write the JSON, print lines."""
    start = time.perf_counter()
    device = resolve_device(args.device)
    name, cfg = resolve_shape(args.shape, device)
    dtype, sizes = default_dtype(device), sorted(set(args.batch_sizes))
    run: dict[str, Any] = {
        "device": device, "name": name, "cfg": cfg, "dtype": dtype, "sizes": sizes, "context": args.context,
        "iters": args.iters, "backend": resolve_backend(args.backend, device, name),
    }  # fmt: skip
    with torch.no_grad():
        run["model"] = random_llama(cfg, device, dtype, seed=0)
        gen = torch.Generator().manual_seed(0)
        run["prompts"] = torch.randint(cfg.vocab_size, (max(sizes), args.context), generator=gen)
        run["next_ids"] = torch.randint(cfg.vocab_size, (max(sizes),), generator=gen)
        base = _variant(run, str(dtype).removeprefix("torch."))
        layers = quantize(run["model"], args.quantization)
        fp8 = _variant(run, args.quantization)
        rows = _rows(run, base, fp8)
    result = {
        **header("model_decode_quant", args, device),
        "shape": name,
        "dtype": str(dtype).removeprefix("torch."),
        "quantization": args.quantization,
        "quantized_layers": layers,
        "context": args.context,
        "variants": {"bf16": base["facts"], args.quantization: fp8["facts"]},
        "parity_check": {
            "metric": "relative L2 of FP8-weight logits vs bf16-weight logits",
            "tolerance": TOLERANCE,
        },
        "seconds": time.perf_counter() - start,
        "rows": rows,
    }
    out = write_result(result, args.out, f"quant_{device.type}_{name}")
    for r in rows:
        f, b = r["fp8"], r["bf16"]
        print(
            f"bs {r['bs']}: bf16 {b['graphrt_us']['p50']:.0f} µs ({b['over_floor']:.2f}x floor), "
            f"fp8 {f['graphrt_us']['p50']:.0f} µs ({f['over_floor']:.2f}x its floor), "
            f"fp8/bf16 {r['fp8_over_bf16']:.3f} (steady {r['steady_fp8_over_bf16']:.3f}), "
            f"rel L2 {r['parity']['rel_l2']:.3f}"
        )
    print(f"written {out}")
    return 0
