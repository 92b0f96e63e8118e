"""Launching the fused sampler (:mod:`graphrt.runtime.sampler.kernel`): its workspace, two launches.

The kernels keep per-chunk partial results and a per-row arrival counter in a workspace. The
counters must read 0 when a launch starts; every launch leaves them at 0, so a workspace is
zeroed once, when allocated, and then reused: one per (device, stream, rows rounded up to a
power of two, layout), made and kept as :mod:`graphrt.kernels.scratch` keeps shared scratch
(outside graph capture; a capture that finds none allocates its own, not shared).

On SM90+ ``_count`` is launched with programmatic dependent launch (as the skinny GEMM is):
``_scan`` lets it launch at once, and its programs wait (``gdc_wait``) for all of ``_scan``
before reading anything, so its launch latency hides behind ``_scan``. ``GRAPHRT_PDL=0``
launches it plainly (A/B timing); never under the interpreter.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from graphrt.kernels import scratch, tuning
from graphrt.kernels.switches import KERNELS_PDL_ENV, pdl_enabled, triton
from graphrt.metadata.sampling import SamplingBuffers
from graphrt.runtime.sampler import count as sampler_count
from graphrt.runtime.sampler import kernel as sampler_kernel

#: Masses of a row sum below 2**53 (exact in float64): ``V * 2**32 < 2**53``.
MAX_VOCAB = 2**21
#: Vocabulary entries per program (at most 4096: see ``_count``), the default layout's.
CHUNK = 4096
#: Records a chunk keeps, and a row (see the kernel module: more is exact, but slow).
RECORDS = 32
FRONTIER = 64
WARPS = 8
#: Columns of ``_count``'s pass over its chunk: its first pass compares ``TALLY - 1`` records and
#: sums the chunk's whole mass in the last column (a row has a few records).
TALLY = 4
#: Records the row's last ``_count`` program decides among per round trip of the chunks' counts.
DECIDE = 8


@dataclass(frozen=True, slots=True)
class Layout:
    """How the kernels cut a row: ``chunk`` entries per program (a power of two, 128..4096),
    ``warps`` per program, ``records`` a chunk keeps, records ``_count`` compares in one pass
    (``tally``, a power of two), and ``scan_warps`` for ``_scan`` alone (0: ``warps``; its
    scores are compute-bound on one SM a chunk, the count's tallies are not). Any layout draws
    the same tokens (the tests force small ones); it changes only the speed (``graphrt bench
    sampler --sweep``)."""

    # NOTE: read when a Layout is made, so tests that patch the module's constants get them
    chunk: int = field(default_factory=lambda: CHUNK)
    warps: int = field(default_factory=lambda: WARPS)
    records: int = field(default_factory=lambda: RECORDS)
    tally: int = field(default_factory=lambda: TALLY)
    scan_warps: int = 0

    def __post_init__(self) -> None:
        if not (128 <= self.chunk <= 4096 and self.chunk & (self.chunk - 1) == 0):
            raise ValueError(f"sampler layout: chunk {self.chunk} is not a power of two in 128..4096")
        if not 1 <= self.records < 256:
            raise ValueError(f"sampler layout: {self.records} records a chunk; 1..255")
        if not (1 <= self.tally <= 64 and self.tally & (self.tally - 1) == 0):
            raise ValueError(f"sampler layout: tally {self.tally} is not a power of two in 1..64")
        if self.scan_warps and not (self.scan_warps <= 32 and self.scan_warps & (self.scan_warps - 1) == 0):
            raise ValueError(
                f"sampler layout: scan_warps {self.scan_warps} is not 0 or a power of two up to 32"
            )


def layout_for(vocab: int) -> Layout:
    """The layout the active tuning table's ``sampler_layouts`` give ``vocab`` (the first rule
    whose ``max_vocab >= vocab``; :class:`Layout`'s defaults above them all). NOTE: on the H100
    chunks of 2048 on 8 warps beat 4096, 1024 and 16 warps, and at 128k two records a tally pass
    beat four (``graphrt bench sampler --sweep``; docs/gpu.md has the figures)."""
    for rule in tuning.active().sampler_layouts:
        if vocab <= rule.max_vocab:
            return Layout(rule.chunk, rule.warps, rule.records, rule.tally, rule.scan_warps)
    return Layout()


#: ``0`` launches ``_count`` without programmatic dependent launch.
PDL_ENV = KERNELS_PDL_ENV


@dataclass(slots=True)
class Workspace:
    """The kernels' scratch for ``rows`` rows of ``chunks`` chunks (int64 unless noted)."""

    tops: torch.Tensor  # [rows, chunks] each chunk's largest rank key
    records: torch.Tensor  # [rows, chunks, RECORDS, 2] each chunk's records (rank key, score key)
    counts: torch.Tensor  # [rows, chunks] records found + 256 if the chunk's were all found
    frontier: torch.Tensor  # [rows, FRONTIER] the row's records (rank keys), score-best first
    state: torch.Tensor  # [rows, 3] done (0) / count (1), the row's records, largest rank key
    mass: torch.Tensor  # [rows, FRONTIER] the row's mass ranked before each record (0 between launches)
    ranks: torch.Tensor  # [rows, FRONTIER] ... and its count of tokens (0 between launches)
    totals: torch.Tensor  # [rows] the row's mass (0 between launches)
    arrivals: torch.Tensor  # [rows, 2] int32, zero between launches

    @classmethod
    def allocate(cls, rows: int, chunks: int, records: int, device: torch.device) -> Workspace:
        def empty(*shape: int) -> torch.Tensor:
            return torch.empty(rows, *shape, dtype=torch.int64, device=device)

        return cls(
            tops=empty(chunks),
            records=empty(chunks, records, 2),
            counts=empty(chunks),
            frontier=empty(FRONTIER),
            state=empty(3),
            mass=torch.zeros(rows, FRONTIER, dtype=torch.int64, device=device),
            ranks=torch.zeros(rows, FRONTIER, dtype=torch.int64, device=device),
            totals=torch.zeros(rows, dtype=torch.int64, device=device),
            arrivals=torch.zeros(rows, 2, dtype=torch.int32, device=device),
        )


def check_vocab(vocab: int) -> None:
    """Raise ``ValueError`` for a vocabulary the sampler's exact masses cannot sum."""
    if vocab >= MAX_VOCAB:
        raise ValueError(f"sampler: vocabulary of {vocab} tokens; at most {MAX_VOCAB - 1}")


def workspace(rows: int, chunks: int, device: torch.device, records: int | None = None) -> Workspace:
    """The shared workspace for ``rows`` rows on the current stream (:func:`graphrt.kernels.scratch.shared`:
    see the module docstring); ``records`` a chunk keeps (default :data:`RECORDS`)."""
    records = RECORDS if records is None else records
    capacity = max(8, 1 << (rows - 1).bit_length())
    key = ("sampler", capacity, chunks, records, FRONTIER)
    return scratch.shared(key, lambda: Workspace.allocate(capacity, chunks, records, device), device)


def pdl_default(device: torch.device) -> bool:
    """PDL on SM90+ CUDA devices unless ``GRAPHRT_PDL=0``."""
    return pdl_enabled(PDL_ENV, device)


def fused_sample(
    logits: torch.Tensor,
    params: SamplingBuffers,
    pdl: bool | None = None,
    layout: Layout | None = None,
) -> torch.Tensor:
    """:func:`graphrt.runtime.sampler.draw.sample` by the Triton kernels: ``[R, V]`` logits → ``[R]`` int64.

    ``pdl``: launch ``_count`` with programmatic dependent launch (default :func:`pdl_default`);
    ``layout``: how rows are cut (default :func:`layout_for` the vocabulary).
    """
    rows, vocab = logits.shape
    check_vocab(vocab)
    assert triton is not None, "the fused sampler needs Triton"
    if logits.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        logits = logits.float()
    if logits.stride(-1) != 1:
        logits = logits.contiguous()
    tokens = torch.empty(rows, dtype=torch.int64, device=logits.device)
    if rows == 0:
        return tokens
    layout = layout_for(vocab) if layout is None else layout
    chunks = triton.cdiv(vocab, layout.chunk)
    ws = workspace(rows, chunks, logits.device, layout.records)
    p = params
    rowwise = (p.temperature, p.top_k, p.top_p, p.min_p, p.seed, p.position, tokens)
    shape = {
        "S": chunks,
        "S_PAD": triton.next_power_of_2(chunks),
        "C": layout.chunk,
        "GF": FRONTIER,
        "ACCURATE": logits.device.type == "cuda",
        "num_warps": layout.warps,
        # NOTE: no a*b+c contracted into an FMA: every float32 step rounds as torch's does
        "enable_fp_fusion": False,
    }
    pdl = pdl_default(logits.device) if pdl is None else pdl
    grid = (rows, chunks)
    scan_shape = {**shape, "num_warps": layout.scan_warps or layout.warps}
    sampler_kernel._scan[grid](
        logits, logits.stride(0), vocab, *rowwise,
        ws.tops, ws.records, ws.counts, ws.frontier, ws.state, ws.arrivals, PF=layout.records, PDL=pdl, **scan_shape,
    )  # fmt: skip
    sampler_count._count[grid](
        logits, logits.stride(0), vocab, *rowwise, ws.frontier, ws.state, ws.mass, ws.ranks, ws.totals,
        ws.arrivals, GB=min(layout.tally, FRONTIER), GD=min(DECIDE, FRONTIER), PDL=pdl, launch_pdl=pdl, **shape,
    )  # fmt: skip
    return tokens
