"""The tunables of graphrt's Triton kernels, per GPU: one frozen :class:`TuningTable`.

Tiles and launch shapes decide how fast a kernel streams, never what it computes (every
candidate gives the same math; the tile-sweeping tools check each against a torch reference).
The best ones differ per GPU (SM count, bandwidth, L2), so they are held in a table keyed by the
device name (:mod:`graphrt.kernels.tuning.device`) instead of module constants:

- the skinny GEMM (:mod:`graphrt.kernels.skinny`; the FP8 GEMM takes its tiles too): rule rows
  ``(largest M, largest K, tile)`` and per-shape overrides ``(M class, N, K) -> tile``;
- the fused prologue GEMMs (:mod:`graphrt.kernels.prologue`): the norm kernel's tile and per-shape
  tiles ``(N, K) -> tile``;
- the split decode attention (:mod:`graphrt.attention.split_decode`): warps per head dim, the
  merge step's fp32 values, the waves of programs the split count aims at;
- the fused sampler (:mod:`graphrt.runtime.sampler.launch`): layout rules by vocabulary;
- the MoE expert kernels (:mod:`graphrt.kernels.moe.triton_experts`): tiles and the largest
  ``T * k`` the skinny expert path takes.

:data:`DEFAULT` holds the constants swept on the H100 (docs/gpu.md has the figures).
"""

from __future__ import annotations

from dataclasses import dataclass


def pow2(n: int) -> int:
    """The smallest power of two ``>= n`` (1 for ``n <= 1``): what tiles and blocks round to."""
    return 1 << max(n - 1, 0).bit_length()


def _powers_of_two(record: object, names: tuple[str, ...]) -> None:
    """``ValueError`` naming the first of ``names`` whose value is not a power of two >= 1."""
    for name in names:
        value = getattr(record, name)
        if not isinstance(value, int) or value < 1 or value & (value - 1):
            raise ValueError(f"{type(record).__name__}.{name} must be a power of two >= 1, got {value!r}")


@dataclass(frozen=True, slots=True)
class Tile:
    """One program's share of a skinny GEMM: ``block_n`` rows of ``W`` by ``block_k`` columns per
    loop step.

    Powers of two; the ``tl.dot`` path (``M > 1``) needs ``block_n, block_k >= 16``.
    ``stages``: 1: the kernel's own one-tile-ahead register prefetch (the first tile loaded before
    the PDL wait); more: the loop loads each tile where it multiplies it and Triton's pipeliner
    keeps ``stages`` tiles in flight through shared memory (all after the wait).
    """

    block_n: int
    block_k: int
    warps: int = 4
    stages: int = 1

    def __post_init__(self) -> None:
        _powers_of_two(self, ("block_n", "block_k", "warps"))
        if not isinstance(self.stages, int) or self.stages < 1:
            raise ValueError(f"Tile.stages must be >= 1, got {self.stages!r}")

    def fit(self, m: int, n: int, k: int) -> Tile:
        """This tile shrunk to ``N`` and ``K`` (never below the ``tl.dot`` minimum of 16)."""
        low = 16 if m > 1 else 1
        bn = max(low, min(self.block_n, pow2(n)))
        bk = max(low, min(self.block_k, pow2(k)))
        return Tile(bn, bk, self.warps, self.stages)


@dataclass(frozen=True, slots=True)
class SkinnyRule:
    """A rule row of the skinny GEMM: ``tile`` for ``M <= max_m`` and ``K <= max_k`` (first wins)."""

    max_m: int
    max_k: int
    tile: Tile


@dataclass(frozen=True, slots=True)
class ShapeTile:
    """A tile for one weight shape: ``m_class`` (the skinny GEMM's; 1 for the prologue), ``N``, ``K``."""

    m_class: int
    n: int
    k: int
    tile: Tile


@dataclass(frozen=True, slots=True)
class SamplerRule:
    """A sampler layout for vocabularies up to ``max_vocab`` (the fields of ``sampler.launch.Layout``)."""

    max_vocab: int
    chunk: int
    warps: int
    records: int
    tally: int = 4
    scan_warps: int = 0

    def __post_init__(self) -> None:
        _powers_of_two(self, ("chunk", "warps", "tally"))


@dataclass(frozen=True, slots=True)
class MoeTiles:
    """``block_n x block_k`` of the grouped expert GEMMs (``tl.dot``, ``BLOCK_M`` rows) and of the
    skinny expert GEMVs: the up kernel reads ``skinny_n`` rows of ``w13`` (gate and up halves) by
    up to ``skinny_k`` columns per loop step on ``skinny_warps`` warps; the down kernel reads
    ``skinny_down_n`` rows of ``w2`` by ``skinny_down_k`` on ``skinny_down_warps`` (0: the up
    kernel's value, as tables written before the down fields existed mean), a token's slots
    walked in ``skinny_down_split`` parts (programs) whose fp32 partial sums a second kernel adds."""

    block_n: int = 64
    block_k: int = 64
    warps: int = 8
    stages: int = 3
    skinny_n: int = 8
    skinny_k: int = 1024
    skinny_warps: int = 8
    skinny_down_n: int = 0
    skinny_down_k: int = 0
    skinny_down_warps: int = 0
    skinny_down_split: int = 1

    def __post_init__(self) -> None:
        names = ("block_n", "block_k", "warps", "skinny_n", "skinny_k", "skinny_warps", "skinny_down_split")
        _powers_of_two(self, names)
        if self.skinny_n < 2:
            raise ValueError(f"MoeTiles.skinny_n must be >= 2 (gate and up halves), got {self.skinny_n}")
        down = ("skinny_down_n", "skinny_down_k", "skinny_down_warps")
        _powers_of_two(self, tuple(name for name in down if getattr(self, name) != 0))

    def skinny_up(self) -> tuple[int, int, int]:
        """``(rows of w13, columns per step, warps)`` of the skinny up kernel."""
        return self.skinny_n, self.skinny_k, self.skinny_warps

    def skinny_down(self) -> tuple[int, int, int]:
        """``(rows of w2, columns per step, warps)`` of the skinny down kernel (0s read as up's)."""
        own = (self.skinny_down_n, self.skinny_down_k, self.skinny_down_warps)
        return tuple(d or u for d, u in zip(own, self.skinny_up(), strict=True))  # type: ignore[return-value]


@dataclass(frozen=True, slots=True)
class TuningTable:
    """Every tunable of the Triton kernels for one GPU, and where the table came from.

    ``name``: the device key (``NVIDIA_H100_80GB_HBM3``) or ``default``; ``path``: the file read
    (``built-in`` for :data:`DEFAULT`); ``source``: per tunable group, where its values came from
    (the sweep and its results, or "H100 defaults, not measured here").
    """

    name: str
    path: str
    source: tuple[tuple[str, str], ...]
    skinny_rules: tuple[SkinnyRule, ...]
    skinny_overrides: tuple[ShapeTile, ...]
    prologue_norm_tile: Tile | None
    prologue_tiles: tuple[ShapeTile, ...]
    decode_warps: tuple[tuple[int, int], ...]
    decode_merge_tile: int
    decode_waves: int
    sampler_layouts: tuple[SamplerRule, ...]
    moe: MoeTiles
    moe_skinny_slots: int

    def __post_init__(self) -> None:
        for d, warps in self.decode_warps:
            if warps < 1 or warps & (warps - 1):
                raise ValueError(f"decode_warps[{d}] must be a power of two >= 1, got {warps}")
        if self.decode_merge_tile < 1 or self.decode_waves < 1 or self.moe_skinny_slots < 0:
            raise ValueError(
                f"decode_merge_tile {self.decode_merge_tile} and decode_waves {self.decode_waves} "
                f"must be >= 1, moe_skinny_slots {self.moe_skinny_slots} >= 0"
            )

    def skinny_tile(self, m_class: int, m: int, n: int, k: int) -> Tile:
        """The skinny GEMM's tile (unfitted): an override for ``(m_class, N, K)``, else the first
        rule with ``M <= max_m`` and ``K <= max_k``."""
        for o in self.skinny_overrides:
            if (o.m_class, o.n, o.k) == (m_class, n, k):
                return o.tile
        for rule in self.skinny_rules:
            if m <= rule.max_m and k <= rule.max_k:
                return rule.tile
        raise ValueError(f"tuning table {self.name}: no skinny rule takes M={m}, K={k}")

    def prologue_tile(self, n: int, k: int, norm: bool) -> Tile | None:
        """A fused prologue kernel's tile for ``[N, K]`` (None: the skinny GEMM's single-row rule)."""
        for s in self.prologue_tiles:
            if (s.n, s.k) == (n, k):
                return s.tile
        return self.prologue_norm_tile if norm else None

    def split_warps(self, head_dim: int) -> int:
        """Warps of a split decode program for ``head_dim``."""
        for d, warps in self.decode_warps:
            if d == head_dim:
                return warps
        raise ValueError(f"tuning table {self.name}: no decode warps for head dim {head_dim}")

    def brief(self) -> dict[str, str]:
        """``{"name", "path"}``: what the capture report and ``graphrt inspect`` name."""
        return {"name": self.name, "path": self.path}


#: Where :data:`DEFAULT`'s values came from: the H100 sweeps that docs/gpu.md ("Per-GPU tuning
#: tables") lists with their commands and results (the committed H100 table says the same).
H100_SOURCE: tuple[tuple[str, str], ...] = tuple(
    (group, "H100 sweeps, docs/gpu.md") for group in ("skinny", "prologue", "decode", "sampler", "moe")
)

#: Today's constants: the H100's sweeps. Unknown GPUs and the CPU run with these.
DEFAULT = TuningTable(
    name="default",
    path="built-in",
    source=H100_SOURCE,
    skinny_rules=(
        SkinnyRule(1, 1 << 62, Tile(block_n=8, block_k=2048, warps=8)),
        SkinnyRule(16, 1 << 62, Tile(block_n=16, block_k=1024, warps=8)),
        SkinnyRule(64, 1 << 62, Tile(block_n=32, block_k=128, warps=4)),
    ),
    skinny_overrides=(ShapeTile(1, 4096, 14336, Tile(block_n=8, block_k=1024, warps=4)),),
    prologue_norm_tile=Tile(block_n=8, block_k=2048, warps=4),
    prologue_tiles=(),
    decode_warps=((64, 4), (128, 8), (256, 8)),
    decode_merge_tile=4096,
    decode_waves=2,
    sampler_layouts=(SamplerRule(65536, 2048, 8, 16), SamplerRule((1 << 21), 2048, 8, 8, 2)),
    moe=MoeTiles(
        block_k=128,
        skinny_n=4,
        skinny_k=2048,
        skinny_warps=4,
        skinny_down_n=8,
        skinny_down_k=1024,
        skinny_down_warps=8,
    ),
    moe_skinny_slots=32,
)
