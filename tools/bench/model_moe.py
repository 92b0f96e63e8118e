"""``graphrt bench model --shape <MoE preset>``: a MoE model's graphed decode step against its floor.

The floor counts the bytes a step must read: attention and dense weights (every parameter but
the routed experts and the embedding table; a shared expert held in the expert tensors counted
here once, as the dense MLP it was), plus, per MoE layer, the *distinct* routed experts that
step's tokens route to. The distinct experts are counted on the host after the timed region, in
one eager step with a hook on each MoE layer reading the routing buffer it just wrote (the
graph's replays run no Python). The bytes are read at the copy bandwidth measured here
(``model_steps.weight_floor``). A graphed step of ``--pad-bs`` requests in the next bucket up
(default 9 in 16) shows pad rows reading no expert: its routing buffer's pad rows hold the id
past every expert (routed and fused shared). transformers' eager step is not measured for MoE shapes (no twin yet).
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import numpy as np
import torch
from torch import nn

from graphrt.checkpoints.loader import default_dtype
from graphrt.models.indexed_mla import mla_decoder
from graphrt.models.llama import TinyLlama
from graphrt.models.moe import Gate, SparseMoE
from graphrt.models.presets import MLAConfig, preset
from graphrt.tools.bench import model_steps as steps
from graphrt.tools.bench.device_ops import profile_steps
from graphrt.tools.bench.model_table import PROFILE_STEPS
from graphrt.tools.bench.record import header, percentiles, time_us, write_result
from graphrt.tools.cli.args import resolve_backend, resolve_device

#: Expert parameters (read only for the experts a step routes to).
EXPERT_PARAMS = ("experts.w13", "experts.w2", "experts.b13", "experts.b2")


def moe_shape(value: str | None) -> Any:
    """The preset ``value`` names when it has MoE layers (timed here), else None."""
    if value is None:
        return None
    try:
        cfg = preset(value)
    except ValueError:
        return None
    return cfg if getattr(cfg, "moe", None) is not None else None


def random_moe(cfg: Any, device: torch.device, dtype: torch.dtype, seed: int = 0) -> nn.Module:
    """A MoE preset's model, random weights drawn on ``device`` (as ``model_twin.random_llama``:
    nothing passes through host memory). Matrices and experts ``N(0, 1/fan_in)``, norms
    ``1 + N(0, 0.1)``, the embedding ``N(0, 1)``."""
    model = mla_decoder(cfg)(cfg) if isinstance(cfg, MLAConfig) else TinyLlama(cfg)
    gen = torch.Generator(device).manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            data = torch.empty(p.shape, device=device, dtype=dtype)
            if "norm" in name:
                data.normal_(0.0, 0.1, generator=gen).add_(1.0)
            else:
                data.normal_(0.0, 1.0 if "embed" in name else p.shape[-1] ** -0.5, generator=gen)
            p.data = data
    for module in model.modules():  # NOTE: DeepSeek's router stays float32 (Gate._apply keeps it)
        if isinstance(module, Gate):
            module.to(dtype)
    model.inv_freq = model.inv_freq.to(device)
    return model.eval()


def dense_bytes(model: nn.Module) -> int:
    """Bytes of every parameter a step reads whole: all but the embedding and the routed experts,
    a shared expert fused into the expert tensors included (every real token reads its pieces)."""
    plain = sum(
        p.numel() * p.element_size()
        for n, p in model.named_parameters()
        if "embed" not in n and not n.endswith(EXPERT_PARAMS)
    )
    layers = [m for m in model.modules() if isinstance(m, SparseMoE)]
    return plain + sum(m.spec.shared_slots * expert_bytes(m) for m in layers)


def expert_bytes(moe: SparseMoE) -> int:
    """Bytes of one routed expert of ``moe`` (its w13, w2 and biases)."""
    params = [p for n, p in moe.named_parameters() if n.endswith(EXPERT_PARAMS)]
    return sum(p[0].numel() * p.element_size() for p in params)


def routed_reads(stack: Any, model: nn.Module, batch: Any) -> tuple[list[int], int]:
    """Distinct routed experts per MoE layer for ``batch`` (one eager step, hooks on each MoE
    layer; fused shared experts are :func:`dense_bytes`), and the expert bytes they make a step read."""
    layers = [m for m in model.modules() if isinstance(m, SparseMoE)]
    counts: list[int] = []

    def hook(module: SparseMoE, args: tuple, out: Any) -> None:
        ids = args[1].routing.topk_ids
        counts.append(int(torch.unique(ids[ids < module.spec.num_experts]).numel()))

    handles = [m.register_forward_hook(hook) for m in layers]
    try:
        stack.runtime.run(batch, eager=True)
    finally:
        for h in handles:
            h.remove()
    return counts, sum(c * expert_bytes(m) for c, m in zip(counts, layers, strict=True))


def pad_rows_route_nowhere(stack: Any, next_ids: np.ndarray, context: int, bucket: int) -> dict[str, Any]:
    """A graphed step of ``bucket // 2 + 1`` requests in bucket ``bucket`` (9 in 16): whether its
    pad rows' ids are all the expert count (no expert read) in the routing buffer (the last MoE
    layer's routing), and the distinct experts its real rows route to."""
    bs = bucket // 2 + 1
    batch = steps.graphrt_decode(stack, next_ids[:bs], context)
    stack.runtime.run(batch)
    group = stack.runtime.groups.group("routing")
    experts = group.full["expert_counts"].shape[0]
    pads = group.view(bucket).topk_ids[bs:]
    counts, _ = routed_reads(stack, stack.model, batch)
    return {
        "bs": bs, "bucket": bucket, "pad_ids_all_no_expert": bool((pads == experts).all()),
        "distinct_experts": sum(counts),
    }  # fmt: skip


def run_bench_moe(args: argparse.Namespace, name: str, cfg: Any) -> int:
    """Time graphed DECODE per batch size against the distinct-expert floor; write the JSON."""
    start = time.perf_counter()
    device = resolve_device(args.device)
    dtype, sizes, context = default_dtype(device), sorted(set(args.batch_sizes)), args.context
    with torch.no_grad():
        model = random_moe(cfg, device, dtype)
        dense = dense_bytes(model)
        floor = steps.weight_floor(min(dense, 4 << 30), device, args.iters)
        stack, _ = steps.graphrt_stack(model, sizes, context, resolve_backend(args.backend, device, name))
        gen = torch.Generator().manual_seed(0)
        prompts = torch.randint(cfg.vocab_size, (max(sizes), context), generator=gen)
        next_ids = torch.randint(cfg.vocab_size, (max(sizes),), generator=gen).numpy()
        steps.graphrt_prefill(stack, prompts.numpy())
        rows = [_row(stack, model, next_ids, context, bs, args.iters, device, dense, floor) for bs in sizes]
        pad = [pad_rows_route_nowhere(stack, next_ids, context, b) for b in sizes if b > 2]
    result = header("model", args, device) | {
        "shape": name, "moe": True, "floor": floor, "dense_bytes": dense, "rows": rows, "pad_checks": pad,
        "hf": "not measured: no transformers twin for MoE shapes yet", "seconds": time.perf_counter() - start,
    }  # fmt: skip
    out = write_result(result, args.out, f"model_{device.type}_{name}")
    for row in rows:
        print(
            f"bs {row['bs']}: graphrt {row['graphrt_us']['p50']:.0f} µs, floor {row['floor_us']:.0f} µs "
            f"({row['over_floor']:.2f}x; {row['distinct_experts']} distinct experts over the MoE layers)"
        )
    print(f"pad checks: {pad}\nwrote {out}")
    return 0


def _row(stack: Any, model: nn.Module, next_ids: np.ndarray, context: int, bs: int, iters: int,
         device: torch.device, dense: int, floor: dict[str, Any]) -> dict[str, Any]:  # fmt: skip
    batch = steps.graphrt_decode(stack, next_ids[:bs], context)
    stack.runtime.run(batch)
    us = percentiles(time_us(lambda: stack.runtime.run(batch), iters, device))
    profile = profile_steps(lambda: stack.runtime.run(batch), device, PROFILE_STEPS, top=16)
    counts, routed = routed_reads(stack, model, batch)
    floor_us = (dense + routed) / (floor["bandwidth_gb_s"] * 1e9) * 1e6
    return {
        "bs": bs, "graphrt_us": us, "distinct_experts": sum(counts), "distinct_per_layer": counts,
        "read_bytes": dense + routed, "floor_us": floor_us, "over_floor": us["p50"] / floor_us,
        "device": profile,
    }  # fmt: skip
