"""What capture and stepping report: graphs captured (and pending), replays, eager steps, fallbacks."""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field

from graphrt.buffers import MemoryReport
from graphrt.capture import Dispatcher, GraphInfo
from graphrt.runtime.variants import LEAN, SPLIT, Variants


@dataclass(frozen=True, slots=True)
class CaptureReport:
    """What :meth:`GraphRuntime.capture` did: engine, backend, each graph's facts, seconds, buffers,
    the switches the runtime was built with (name -> value, :mod:`graphrt.kernels.switches`) and
    the kernels' tuning table (``{"name", "path"}``, :mod:`graphrt.kernels.tuning`).

    With lazy capture (``RuntimeConfig(capture="lazy")``) ``graphs`` are those captured so far
    (:meth:`GraphRuntime.report`), ``pending`` the ``(mode, bucket)`` keys no step has needed
    yet, and ``seconds`` the capture time spent so far, at build and during steps together.
    """

    engine: str
    backend: str
    graphs: tuple[GraphInfo, ...]
    seconds: float
    buffers: MemoryReport
    switches: dict[str, str] = field(default_factory=dict)
    policy: str = "eager"
    pending: tuple[tuple[Hashable, int], ...] = ()
    tuning: dict[str, str] = field(default_factory=dict)

    @property
    def pool_bytes(self) -> int:
        """Graph memory-pool bytes of every graph together."""
        return sum(g.pool_bytes for g in self.graphs)

    def __str__(self) -> str:
        lazy = f", {len(self.pending)} pending (lazy)" if self.policy == "lazy" else ""
        return (
            f"{len(self.graphs)} graphs{lazy} ({self.engine} engine, {self.backend} backend) in "
            f"{self.seconds:.2f} s; pool {self.pool_bytes / 2**20:.1f} MiB; "
            f"static buffers {self.buffers.total_bytes} B"
            + (f"; tuning table {self.tuning['name']} ({self.tuning['path']})" if self.tuning else "")
        )


@dataclass(frozen=True, slots=True)
class RuntimeStats:
    """What :meth:`GraphRuntime.stats` reports, keyed by mode name.

    ``captures``: mode -> bucket -> how many times its graph was captured (once per ladder;
    a lazy runtime's keys appear as steps first need them). ``split``: of ``replays``, those
    that ran the mode's split pair (forward graph, ``ready``, sampler graph;
    :mod:`graphrt.runtime.split_pairs`); ``lean``: those that ran its lean graph (no sampler
    extras; :mod:`graphrt.runtime.lean`).
    """

    replays: dict[str, int]
    eager: dict[str, int]  # eager steps per mode (forced, eager-only modes and fallbacks)
    fallbacks: dict[str, dict[str, int]]  # mode -> reason -> count
    captures: dict[str, dict[int, int]] = field(default_factory=dict)
    split: dict[str, int] = field(default_factory=dict)
    lean: dict[str, int] = field(default_factory=dict)

    @classmethod
    def of(
        cls,
        dispatcher: Dispatcher,
        eager: Mapping[Hashable, int],
        captures: Counter[tuple[Hashable, int]],
        variants: Mapping[str, Variants] | None = None,
    ) -> RuntimeStats:
        """The counters of ``dispatcher``, the eager steps per mode, the captures per key and the
        replays of each kind of variant per mode (``variants``: the capturer's stores by kind,
        :class:`~graphrt.runtime.variants.Variants`, each counting its ``steps``)."""
        fallbacks: dict[str, dict[str, int]] = {}
        for fb, n in dispatcher.fallbacks.items():
            fallbacks.setdefault(_name(fb.mode), {})[fb.reason] = n
        counted: dict[str, dict[int, int]] = {}
        for (mode, bucket), n in sorted(captures.items(), key=lambda kv: (_name(kv[0][0]), kv[0][1])):
            counted.setdefault(_name(mode), {})[bucket] = n
        replays = {_name(m): n for m, n in dispatcher.replays.items()}
        steps = {kind: {_name(m): n for m, n in v.steps.items()} for kind, v in (variants or {}).items()}
        eager_steps = {_name(m): n for m, n in eager.items()}
        return cls(replays, eager_steps, fallbacks, counted, steps.get(SPLIT, {}), steps.get(LEAN, {}))


def _name(mode: Hashable) -> str:
    return getattr(mode, "name", str(mode))
