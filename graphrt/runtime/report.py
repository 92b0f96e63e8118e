"""What capture and stepping report: graphs captured, replays, eager steps and fallbacks."""

from __future__ import annotations

from dataclasses import dataclass, field

from graphrt.buffers import MemoryReport
from graphrt.capture import GraphInfo


@dataclass(frozen=True, slots=True)
class CaptureReport:
    """What :meth:`GraphRuntime.capture` did: engine, backend, each graph's facts, seconds, buffers,
    the switches the runtime was built with (name -> value, :mod:`graphrt.kernels.switches`) and
    the kernels' tuning table (``{"name", "path"}``, :mod:`graphrt.kernels.tuning`)."""

    engine: str
    backend: str
    graphs: tuple[GraphInfo, ...]
    seconds: float
    buffers: MemoryReport
    switches: dict[str, str] = field(default_factory=dict)
    tuning: dict[str, str] = field(default_factory=dict)

    @property
    def pool_bytes(self) -> int:
        """Graph memory-pool bytes of every graph together."""
        return sum(g.pool_bytes for g in self.graphs)

    def __str__(self) -> str:
        return (
            f"{len(self.graphs)} graphs ({self.engine} engine, {self.backend} backend) in "
            f"{self.seconds:.2f} s; pool {self.pool_bytes / 2**20:.1f} MiB; "
            f"static buffers {self.buffers.total_bytes} B"
            + (f"; tuning table {self.tuning['name']} ({self.tuning['path']})" if self.tuning else "")
        )


@dataclass(frozen=True, slots=True)
class RuntimeStats:
    """What :meth:`GraphRuntime.stats` reports, keyed by mode name."""

    replays: dict[str, int]
    eager: dict[str, int]  # eager steps per mode (forced, eager-only modes and fallbacks)
    fallbacks: dict[str, dict[str, int]]  # mode -> reason -> count
