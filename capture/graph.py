"""What both capture engines produce: a replayable graph plus the facts recorded about it."""

from __future__ import annotations

import gc
from collections.abc import Callable, Hashable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from graphrt.capture.topology import GraphTopology


@dataclass(frozen=True, slots=True)
class KernelCount:
    """One kernel (or recorded op) of a graph, with how often it appears.

    ``launch`` is ``"grid,block,smem"`` on CUDA (distinct values of a grouped kernel joined by
    ``" | "``), empty on the emulated engine. ``time_us`` is the GPU time of all ``count``
    launches in one profiled replay, when recorded. ``pdl``: how many of the ``count`` launches
    have a programmatic (PDL) in-edge, when the graph's topology was read.
    """

    name: str
    count: int
    launch: str = ""
    time_us: float | None = None
    pdl: int = 0


@dataclass(slots=True)
class GraphInfo:
    """Facts recorded when a graph was captured (and counters updated on replay).

    ``capture_seconds`` is recording plus instantiation (``instantiate_seconds`` of it);
    ``warmup_seconds`` the eager runs before it. ``pool_bytes``: what the graph added to the
    memory pool, from the allocator's own counters (never negative; over a whole capture the
    sum is the pool's growth). ``topology``: the nodes and their programmatic (PDL) edges, or
    None where it cannot be read (a CUDA graph without ``cuda.bindings``).
    """

    key: Hashable
    capture_seconds: float
    pool_bytes: int
    num_nodes: int
    kernels: tuple[KernelCount, ...]
    host_scalars: dict[str, Any] = field(default_factory=dict)
    replays: int = 0
    warmup_seconds: float = 0.0
    instantiate_seconds: float = 0.0
    topology: GraphTopology | None = None

    @property
    def programmatic_edges(self) -> int | None:
        """Programmatic (PDL) dependency edges of the graph; None when its topology is unknown."""
        return None if self.topology is None else self.topology.programmatic_edges


class Graph(Protocol):
    """A captured region that re-runs its device work on the tensors it was captured with."""

    info: GraphInfo

    def replay(self) -> None:
        """Re-run the captured work (asynchronously on CUDA)."""
        ...


class SplitGraph:
    """Two graphs of one key replayed back to back, a host call between their launches.

    ``first`` writes static outputs that ``second`` reads (the caller captures both into the
    engine's one pool); ``keep`` holds them for the pair's life, so no later capture reuses
    their memory.
    On CUDA the launches are asynchronous: the host call runs while ``first`` runs on the
    device, and what it enqueues on the stream (e.g. an upload ``second`` reads) is ordered
    between the two. No other graph of the pool may replay between the parts (it could
    overwrite ``first``'s outputs); :meth:`replay` keeps that.
    """

    def __init__(self, first: Graph, second: Graph, keep: Any = None) -> None:
        self.first, self.second, self.keep = first, second, keep

    @property
    def parts(self) -> tuple[Graph, Graph]:
        """Both graphs, in replay order."""
        return self.first, self.second

    def replay(self, between: Callable[[], None] | None = None) -> None:
        """Launch ``first``, call ``between`` (if any), launch ``second``."""
        self.first.replay()
        if between is not None:
            between()
        self.second.replay()


class CaptureEngine(Protocol):
    """Records ``fn`` once and returns something that re-runs its device work.

    ``fn`` must write its results into tensors that outlive it (static buffers); the value
    it returns is kept by the caller as the graph's static output.
    """

    name: str

    def capture(self, key: Hashable, fn: Callable[[], Any], warmup: int) -> tuple[Graph, Any]:
        """Warm ``fn`` up, record it once; returns the graph and ``fn``'s (static) output."""
        ...

    def frozen_gc(self) -> Any:
        """A context manager that keeps the garbage collector out of capture."""
        ...


@contextmanager
def frozen_gc() -> Iterator[None]:
    """Collect once, then keep the garbage collector off the heap while capturing.

    NOTE: a gc pass during capture walks every Python object per graph; freezing the heap
    first made SGLang's capture 2-4x faster. Both engines capture inside it.
    """
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()
