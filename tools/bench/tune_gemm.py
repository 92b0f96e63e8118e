"""``graphrt tune``'s GEMM half: the skinny GEMM's and the fused prologues' tiles on this GPU.

Per ``M`` class (1, 16, 64) every candidate of :data:`graphrt.tools.bench.gemm.SWEEP` is timed on
every projection of the tuned models (20 weights back to back in one CUDA graph, as ``bench gemm``
times them) and checked against cuBLAS's outputs (:func:`graphrt.tools.bench.gemm._agreement`:
a wrong tile raises). The class's rule tile is the candidate with the least time summed over the
shapes; a shape whose own best beats the rule by more than :data:`OVERRIDE_GAIN` gets an
override. The fused prologue kernels (single row) the same way over
:data:`graphrt.tools.bench.gemm_prologue.SWEEP`: the norm kernel's tile, then per-shape tiles.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from graphrt.kernels import prologue, skinny, tuning
from graphrt.kernels.tuning import ShapeTile, SkinnyRule, Tile
from graphrt.tools.bench import gemm, gemm_prologue

#: A shape's own best tile replaces the rule's when it is this much faster (relative).
OVERRIDE_GAIN = 0.03
#: ``(model, projection, K, N)`` of a tuned weight.
Shape = tuple[str, str, int, int]


@dataclass(slots=True)
class Timings:
    """p50 µs per (shape, fitted tile), and the unfitted candidate each fitted tile came from."""

    us: dict[tuple[Shape, Tile], float] = field(default_factory=dict)
    rows: list[dict] = field(default_factory=list)

    def total(self, tile: Tile, shapes: list[Shape], m: int) -> float:
        """``tile``'s time summed over ``shapes`` (each shape's fitted tile)."""
        return sum(self.us[(s, tile.fit(m, s[3], s[2]))] for s in shapes)

    def best(self, shape: Shape, m: int, candidates: tuple[Tile, ...]) -> tuple[Tile, float]:
        """The fastest fitted candidate on ``shape`` and its µs."""
        fits = {t.fit(m, shape[3], shape[2]) for t in candidates}
        tile = min(fits, key=lambda t: self.us[(shape, t)])
        return tile, self.us[(shape, tile)]


def _weights(k: int, n: int, device: torch.device) -> list[torch.Tensor]:
    gen = torch.Generator(device).manual_seed(k * 31 + n)
    count = gemm.WEIGHTS[device.type]
    return [torch.randn(n, k, device=device, generator=gen).bfloat16() * k**-0.5 for _ in range(count)]


def _time(
    timings: Timings, shape: Shape, tile: Tile, fn: Callable, x: torch.Tensor, weights: list, ref: list, iters: int
) -> None:  # fmt: skip
    """Time ``fn`` (checked against ``ref``) once per (shape, fitted tile)."""
    if (shape, tile) in timings.us:
        return
    us, outs = gemm._graph_us(fn, x, weights, iters)
    check = gemm._agreement(outs, ref, f"{shape[0]} {shape[1]} {tile}")
    timings.us[(shape, tile)] = us["p50"]
    timings.rows.append({"shape": shape, "tile": tile, "us": us["p50"]} | check)


def sweep_skinny(shapes: list[Shape], classes: tuple[int, ...], iters: int, device: torch.device) -> Timings:
    """Every candidate of every ``M`` class in ``classes`` on every shape (PDL on, as the model runs)."""
    timings = Timings()
    for shape in shapes:
        _, _, k, n = shape
        weights = _weights(k, n, device)
        for m in classes:
            x = torch.randn(m, k, device=device, generator=torch.Generator(device).manual_seed(m)).bfloat16()
            _, ref = gemm._graph_us(lambda a, w: torch.matmul(a, w.t()), x, weights, iters)
            for cand in gemm.SWEEP[m]:
                tile = cand.fit(m, n, k)
                fn = lambda a, w, t=tile: skinny.skinny_linear(a, w, tile=t, pdl=True)  # noqa: E731
                _time(timings, shape, tile, fn, x, weights, ref, iters)
        del weights
        torch.cuda.empty_cache()
    return timings


def pick_skinny(
    timings: Timings, shapes: list[Shape], classes: tuple[int, ...], base: tuning.TuningTable
) -> tuple[tuple[SkinnyRule, ...], tuple[ShapeTile, ...]]:
    """The rule row of each class (least summed time) and the shapes' overrides; classes not swept
    keep ``base``'s rows."""
    rules, overrides = [], []
    for m in skinny.M_CLASSES:
        if m not in classes:
            rules += [r for r in base.skinny_rules if skinny.m_class(r.max_m) == m]
            overrides += [o for o in base.skinny_overrides if o.m_class == m]
            continue
        rule = min(gemm.SWEEP[m], key=lambda t: timings.total(t, shapes, m))
        rules.append(SkinnyRule(m, tuning.files.ANY_K, rule))
        for shape in shapes:
            tile, us = timings.best(shape, m, gemm.SWEEP[m])
            if us < (1 - OVERRIDE_GAIN) * timings.us[(shape, rule.fit(m, shape[3], shape[2]))]:
                overrides.append(ShapeTile(m, shape[3], shape[2], tile))
    return tuple(rules), tuple(dict.fromkeys(overrides))


def sweep_prologue(shapes: list[Shape], iters: int, device: torch.device, extra: tuple[Tile, ...]) -> Timings:
    """The fused kernels' candidates (and ``extra``: the skinny rule and overrides the SiLU kernel
    would otherwise take) on the single-row shapes that have one (qkv, gate_up, lm_head through
    the norm kernel, down through SiLU's)."""
    timings = Timings()
    for shape in shapes:
        _, proj, k, n = shape
        kind = gemm_prologue.KERNEL.get(proj)
        if kind is None:
            continue
        weights = _weights(k, n, device)
        inputs = gemm_prologue._inputs(kind, k, device)
        ref = [gemm_prologue._unfused(kind, inputs, w) for w in weights]
        for cand in (*gemm_prologue.SWEEP, *extra):
            tile = cand.fit(1, n, k)
            fn = gemm_prologue._fused(kind, inputs, tile)
            _time(timings, shape, tile, fn, inputs[0], weights, ref, iters)
        del weights
        torch.cuda.empty_cache()
    return timings


def pick_prologue(
    timings: Timings, shapes: list[Shape], silu_tile: Callable[[int, int], Tile]
) -> tuple[Tile, tuple[ShapeTile, ...]]:
    """The norm kernel's tile (least summed time over the norm shapes) and per-shape tiles that
    beat the tile the kernel would otherwise take (the norm tile, or ``silu_tile(N, K)``: the
    skinny GEMM's single-row tile)."""
    norm_shapes = [s for s in shapes if gemm_prologue.KERNEL.get(s[1]) == "norm"]
    silu_shapes = [s for s in shapes if gemm_prologue.KERNEL.get(s[1]) == "silu"]
    norm = min(gemm_prologue.SWEEP, key=lambda t: timings.total(t, norm_shapes, 1))
    pairs = [(s, norm) for s in norm_shapes] + [(s, silu_tile(s[3], s[2])) for s in silu_shapes]
    out = []
    for shape, default in pairs:
        tile, us = timings.best(shape, 1, (*gemm_prologue.SWEEP, default))
        if us < (1 - OVERRIDE_GAIN) * timings.us[(shape, default.fit(1, shape[3], shape[2]))]:
            out.append(ShapeTile(1, shape[3], shape[2], tile))
    return norm, tuple(dict.fromkeys(out))


def prologue_on(device: torch.device) -> bool:
    """Whether the fused kernels run here (else the sweep keeps the base table's tiles)."""
    return prologue.enabled(device)
