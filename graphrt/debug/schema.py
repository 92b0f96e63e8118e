"""The snapshot schema: plain frozen dataclasses, written as JSON by ``graphrt.debug.snapshot``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from graphrt.runtime.telemetry import StepRecord


@dataclass(frozen=True, slots=True)
class ParityResult:
    """One batch through the graph of ``(mode, bucket)`` and eagerly, compared on real rows.

    ``first_bad`` is the first ``(token, column)`` in row-major order where
    ``|graph - eager| > tol``; ``worst`` is where the difference is largest.
    """

    mode: str
    bucket: int
    bs: int
    max_diff: float
    tol: float
    first_bad: tuple[int, int] | None
    worst: tuple[int, int] | None

    @property
    def ok(self) -> bool:
        return self.first_bad is None


@dataclass(frozen=True, slots=True)
class KernelFacts:
    """A kernel (CUDA) or recorded op (emulated) with its count; launch dims only on CUDA.

    ``name`` is demangled with its template arguments; a kernel launched with several dims
    lists the distinct values joined by ``" | "``. ``time_us``: GPU µs of all ``count``
    launches in one profiled replay (CUDA, when recorded), else None. ``pdl``: a launch of it
    has a programmatic (PDL) in-edge: it may start while the kernel before it finishes.
    """

    name: str
    count: int
    grid: str = ""
    block: str = ""
    smem: str = ""
    time_us: float | None = None
    pdl: bool = False


@dataclass(frozen=True, slots=True)
class BufferRead:
    """A static-buffer view a graph reads: the bucket's slice, at its captured address."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    address: int


@dataclass(frozen=True, slots=True)
class GraphFacts:
    """One captured graph. ``edges`` / ``programmatic_edges``: its dependency edges and how many
    are programmatic (PDL); None where the topology was not read (a CUDA graph without
    ``cuda.bindings``, files written before these fields)."""

    mode: str
    bucket: int
    tokens_per_req: int
    capture_ms: float
    pool_bytes: int
    num_nodes: int
    replays: int
    kernels: tuple[KernelFacts, ...]
    host_scalars: dict[str, Any]
    reads: tuple[BufferRead, ...]
    edges: int | None = None
    programmatic_edges: int | None = None


@dataclass(frozen=True, slots=True)
class FallbackFacts:
    mode: str
    reason: str
    count: int


@dataclass(frozen=True, slots=True)
class PendingFacts:
    """A (mode, bucket) of a lazily capturing runtime that no step has needed yet (no graph)."""

    mode: str
    bucket: int


@dataclass(frozen=True, slots=True)
class BufferFacts:
    """One declared static buffer at its full (allocation) size."""

    name: str
    shape: tuple[str | int, ...]  # symbolic, as declared
    size: tuple[int, ...]
    dtype: str
    pad_kind: str
    pad_value: int | float | str
    host: bool
    nbytes: int
    offset: int  # bytes from the start of the arena
    address: int


@dataclass(frozen=True, slots=True)
class MemoryFacts:
    group: str
    arena_bytes: int
    host_arena_bytes: int
    total_bytes: int
    buffers: tuple[BufferFacts, ...]


@dataclass(frozen=True, slots=True)
class KVFacts:
    """The MHA/GQA KV cache: its ``dtype`` (``float8_e4m3fn`` for FP8), ``nbytes`` of every
    layer's K and V (dummy page included), ``bytes_per_token`` (all layers), pages; an FP8
    cache's per-layer ``k_scale`` / ``v_scale`` (empty otherwise)."""

    dtype: str
    nbytes: int
    bytes_per_token: int
    num_pages: int
    page_size: int
    k_scale: tuple[float, ...] = ()
    v_scale: tuple[float, ...] = ()


@dataclass(frozen=True, slots=True)
class ContentsFacts:
    """Which step the ``.npz`` contents were written by: rows ``bs..bucket`` are pad rows.

    ``bucket`` is None when nothing was replayed yet (the contents are then capture's).
    """

    file: str
    mode: str
    bucket: int | None
    bs: int
    tokens_per_req: int
    pad_values: dict[str, int]
    violations: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class TelemetryFacts:
    capacity: int
    sync: bool
    steps: dict[str, int]
    records: tuple[StepRecord, ...]


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Everything ``graphrt debug`` and ``graphrt inspect`` show; ``arrays`` come from the ``.npz``."""

    version: int
    created: str
    environment: dict[str, Any]
    engine: str
    backend: str
    config: dict[str, Any]
    graphs: tuple[GraphFacts, ...]
    fallbacks: tuple[FallbackFacts, ...]
    replays: dict[str, int]
    eager: dict[str, int]
    memory: MemoryFacts
    contents: ContentsFacts
    telemetry: TelemetryFacts
    parity: tuple[ParityResult, ...]
    #: Every buffer group (step, cascade, draft, local, the attention kind's); ``memory`` is step.
    groups: tuple[MemoryFacts, ...] = ()
    #: The KV cache (MHA/GQA caches; None for an MLA cache, and in files written before it).
    kv: KVFacts | None = None
    #: The ``GRAPHRT_*`` switches the runtime was built with, name -> value (empty in older files).
    switches: dict[str, str] = field(default_factory=dict)
    #: The engine's speculative counters (``EngineStats.speculation()``); empty when it does not
    #: speculate, or the snapshot was taken from a bare runtime.
    speculation: dict[str, Any] = field(default_factory=dict)
    #: Lazy capture's keys still without a graph (empty when every graph was captured, and in older files).
    pending: tuple[PendingFacts, ...] = ()
    #: The kernels' tuning table, ``{"name", "path"}`` (empty in older files).
    tuning: dict[str, str] = field(default_factory=dict)
    arrays: dict[str, np.ndarray] = field(default_factory=dict, compare=False, repr=False)

    def graph(self, mode: str, bucket: int) -> GraphFacts | None:
        return next((g for g in self.graphs if g.mode == mode and g.bucket == bucket), None)
