"""``graphrt tune``'s MoE part: the expert kernels' tiles (the tuning table's ``moe`` group).

Per MoE preset of ``--models``, one layer's routed experts as ``graphrt bench moe`` builds them
(:func:`graphrt.tools.bench.moe.layer`: bf16 random weights, ``k`` distinct random experts per
token, :data:`~graphrt.tools.bench.moe.LAYERS` layers per CUDA graph so no replay finds its
experts in L2) and timed by its :func:`~graphrt.tools.bench.moe.time_layers`; every candidate's output
is checked against :func:`graphrt.kernels.moe.experts_reference` (a mismatch raises).

- The skinny path at :data:`SKINNY_T` token (its kernels forced): the up kernel's tiles
  (:data:`UP`) with the down kernel's held at the base table's, then the down kernel's
  (:data:`DOWN`) with the chosen up tiles, then the down kernel's parts (:data:`SPLITS`): each
  the candidate of least time summed over the presets.
- The grouped GEMMs at :data:`GROUPED_T` tokens (forced): :data:`GROUPED`'s tiles, least summed
  time over presets and token counts.

The base table's own tiles are timed first, so a tie keeps them. ``moe_skinny_slots`` (where
the paths meet) is carried over.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

import torch

from graphrt.kernels import tuning
from graphrt.kernels.moe import experts_reference
from graphrt.kernels.tuning import MoeTiles
from graphrt.tools.bench import moe

SKINNY_T = 1
GROUPED_T = (16, 64)
#: Skinny up kernel: ``(rows of w13 (gate and up halves), columns per step, warps)``.
UP = ((8, 1024, 8), (8, 2048, 8), (16, 1024, 8), (16, 2048, 8), (4, 2048, 4))
#: Skinny down kernel: ``(rows of w2, columns per step, warps)``.
DOWN = ((8, 1024, 8), (4, 1024, 4), (8, 512, 4), (16, 512, 8), (16, 256, 4))
#: Skinny down kernel: parts a token's slots are split into (each its own programs).
SPLITS = (2, 4, 8)
#: Grouped GEMMs: ``(block_n, block_k, warps, stages)`` (8 warps: the up GEMM spills on 4, sm_90).
GROUPED = ((64, 64, 8, 3), (32, 64, 8, 3), (64, 128, 8, 3), (128, 64, 8, 3), (64, 64, 8, 4))


@dataclass(frozen=True, slots=True)
class Case:
    """One timed layer: ``model``'s experts (``shape``, shrunk) at ``tokens`` rows."""

    model: str
    shape: moe.Shape
    tokens: int

    @property
    def skinny(self) -> bool:
        """Whether the case times the skinny path (else the grouped GEMMs)."""
        return self.tokens == SKINNY_T


#: ``(case, tiles) -> p50 µs per layer``.
Timer = Callable[[Case, MoeTiles], float]


def cases(models: list[tuple[str, moe.Shape]]) -> tuple[list[Case], list[Case]]:
    """``(skinny cases, grouped cases)`` of ``(model, expert shape)`` pairs."""
    skinny = [Case(m, s, SKINNY_T) for m, s in models]
    return skinny, [Case(m, s, t) for m, s in models for t in GROUPED_T]


def _pinned(base: MoeTiles) -> MoeTiles:
    """``base`` with its down tiles written out (so a new up tile leaves them as they were)."""
    n, k, w = base.skinny_down()
    return replace(base, skinny_down_n=n, skinny_down_k=k, skinny_down_warps=w)


def up_candidates(base: MoeTiles) -> list[MoeTiles]:
    """``base`` then each of :data:`UP` as its up tiles (down held at ``base``'s), no repeats."""
    pinned = _pinned(base)
    tiles = [replace(pinned, skinny_n=n, skinny_k=k, skinny_warps=w) for n, k, w in UP]
    return list(dict.fromkeys([pinned, *tiles]))


def down_candidates(base: MoeTiles) -> list[MoeTiles]:
    """``base`` then each of :data:`DOWN` as its down tiles, no repeats."""
    pinned = _pinned(base)
    tiles = [replace(pinned, skinny_down_n=n, skinny_down_k=k, skinny_down_warps=w) for n, k, w in DOWN]
    return list(dict.fromkeys([pinned, *tiles]))


def split_candidates(base: MoeTiles) -> list[MoeTiles]:
    """``base`` then each of :data:`SPLITS` as its down kernel's parts, no repeats."""
    return list(dict.fromkeys([base, *(replace(base, skinny_down_split=s) for s in SPLITS)]))


def grouped_candidates(base: MoeTiles) -> list[MoeTiles]:
    """``base`` then each of :data:`GROUPED` as its grouped tiles, no repeats."""
    tiles = [replace(base, block_n=n, block_k=k, warps=w, stages=s) for n, k, w, s in GROUPED]
    return list(dict.fromkeys([base, *tiles]))


def least(timer: Timer, cases: list[Case], candidates: list[MoeTiles]) -> MoeTiles:
    """The candidate of least time summed over ``cases`` (the first on a tie); times each case's
    candidates back to back (one case's layers alive at a time)."""
    total = dict.fromkeys(candidates, 0.0)
    for case in cases:
        for tiles in candidates:
            total[tiles] += timer(case, tiles)
    return min(candidates, key=lambda t: total[t])


def search(timer: Timer, skinny: list[Case], grouped: list[Case], base: MoeTiles) -> MoeTiles:
    """The swept tiles: skinny up, then skinny down (on the chosen up), its split, then the
    grouped GEMMs'."""
    up = least(timer, skinny, up_candidates(base))
    down = least(timer, skinny, split_candidates(least(timer, skinny, down_candidates(up))))
    tiles = least(timer, grouped, grouped_candidates(down)) if grouped else down
    return tiles


@dataclass
class Bench:
    """A :data:`Timer` on ``device``: each (case, tiles) timed once, checked against the reference;
    ``rows`` records every timing."""

    table: tuning.TuningTable
    iters: int
    device: torch.device
    shrink: int = 1
    rows: list[dict] = field(default_factory=list)
    _us: dict[tuple[Case, MoeTiles], float] = field(default_factory=dict, init=False, repr=False)
    _held: tuple[Case, list[moe.Layer], list[torch.Tensor]] | None = field(
        default=None, init=False, repr=False
    )

    def _layers(self, case: Case) -> tuple[list[moe.Layer], list[torch.Tensor]]:
        """The case's layers and their reference outputs (the last case's kept)."""
        if self._held is None or self._held[0] != case:
            self.release()
            count = moe.LAYERS[self.device.type]
            layers = [
                moe.layer(
                    case.shape, case.tokens, case.tokens, self.device, 1000 * i + case.tokens, self.shrink
                )
                for i in range(count)
            ]
            ref = [experts_reference(x, w, r.topk_ids, r.topk_weights) for x, w, r in layers]
            self._held = (case, layers, ref)
        return self._held[1], self._held[2]

    def __call__(self, case: Case, tiles: MoeTiles) -> float:
        if (case, tiles) in self._us:
            return self._us[(case, tiles)]
        layers, ref = self._layers(case)
        fn = moe.forced_path(1 << 30 if case.skinny else 0)
        with tuning.using(replace(self.table, moe=tiles)):
            us, outs = moe.time_layers(fn, layers, self.iters)
        check = moe.agreement(outs, ref, f"graphrt tune moe: {case.model} T={case.tokens} {tiles}")
        p50 = us["p50"] if us else 0.0
        self._us[(case, tiles)] = p50
        self.rows.append({"model": case.model, "tokens": case.tokens, "tile": str(tiles), "us": p50} | check)
        return p50

    def release(self) -> None:
        """Drop the held layers."""
        self._held = None
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
