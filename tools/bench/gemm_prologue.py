"""``graphrt bench gemm --sweep``, single-row rows: the fused prologue kernels' tiles.

At ``M == 1`` the model runs most projections through :mod:`graphrt.kernels.prologue` (the
skinny GEMM with its input's RMSNorm, or SiLU-and-mul, computed while the weight streams): the
qkv, gate_up and lm_head shapes through ``prologue_norm_gemm`` (after the residual add), down
through ``prologue_silu_gemm``. Every program recomputes that input from ``x`` (read from L2),
so the best tile trades programs (wave fill) against the input work each one repeats; this
times :data:`SWEEP`'s tiles, with PDL, 20 weights per graph as the plain sweep does. Each
candidate's outputs are checked against the unfused torch path (norm or SiLU-and-mul in torch,
then cuBLAS). The winner per shape is what the tuning table's ``prologue_tiles`` hold (``graphrt tune``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict
from typing import Any

import torch

from graphrt.kernels import prologue, skinny
from graphrt.models import ops

#: Which fused kernel each single-row projection runs (``o`` has none: its input is attention's).
KERNEL = {"qkv": "norm", "gate_up": "norm", "lm_head": "norm", "down": "silu"}
#: Candidates, ``(block_n, block_k, warps)``; ``Tile.fit`` shrinks ``block_k`` to ``K``.
SWEEP = tuple(
    skinny.Tile(n, k, w)
    for n, k, w in [(4, 2048, 4), (8, 2048, 4), (8, 2048, 8), (16, 2048, 8), (16, 1024, 8),
                    (32, 512, 8), (32, 1024, 8), (16, 512, 4), (8, 1024, 4)]
)  # fmt: skip
EPS = 1e-5


def _inputs(kind: str, k: int, device: torch.device) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator(device).manual_seed(k)
    if kind == "silu":
        return (torch.randn(1, 2 * k, device=device, generator=gen).bfloat16(),)
    x, res = (torch.randn(1, k, device=device, generator=gen).bfloat16() for _ in range(2))
    return x, res, (1 + 0.1 * torch.randn(k, device=device, generator=gen)).bfloat16()


def _fused(
    kind: str, inputs: tuple, tile: skinny.Tile
) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    if kind == "silu":
        return lambda _, w: prologue.silu_mul_linear(inputs[0], w, tile=tile, pdl=True)
    x, res, nw = inputs
    return lambda _, w: prologue.norm_linear(x, res, nw, EPS, w, tile=tile, pdl=True)[0]


def _unfused(kind: str, inputs: tuple, w: torch.Tensor) -> torch.Tensor:
    if kind == "silu":
        return ops.silu_and_mul_ref(inputs[0]) @ w.t()
    x, res, nw = inputs
    return ops.rms_norm_ref(res + x, nw, EPS) @ w.t()


def sweep_prologue(
    row: dict[str, Any], weights: list[torch.Tensor], iters: int,
    graph_us: Callable[..., tuple[Any, list]], agree: Callable[..., dict], cell: Callable[..., dict],
) -> None:  # fmt: skip
    """Add ``prologue`` (the tile the model picks), ``prologue_sweep`` and ``prologue_best_tile``
    to a single-row ``row`` of a projection that has a fused kernel (nothing otherwise)."""
    kind = KERNEL.get(row["proj"])
    if kind is None or row["m"] != 1 or not prologue.enabled(weights[0].device):
        return
    n, k = row["n"], row["k"]
    inputs = _inputs(kind, k, weights[0].device)
    ref = [_unfused(kind, inputs, w) for w in weights]
    chosen = prologue.tile_for(n, k, kind == "norm")
    tried: dict[skinny.Tile, dict] = {}
    for tile in (chosen, *SWEEP):
        fit = tile.fit(1, n, k)
        if fit in tried:
            continue
        us, outs = graph_us(_fused(kind, inputs, fit), inputs[0], weights, iters)
        what = f"{row['model']} {row['proj']} fused {kind} {fit}"
        tried[fit] = {"tile": asdict(fit)} | cell(us, row["bytes"]) | agree(outs, ref, what)
    row["prologue_kernel"] = kind
    row["prologue"] = tried[chosen.fit(1, n, k)]
    row["prologue_sweep"] = list(tried.values())
    row["prologue_best_tile"] = min(tried.values(), key=lambda c: c["us"]["p50"])["tile"]
