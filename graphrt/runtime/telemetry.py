"""Per-step timings in a bounded ring: what each replay cost and why a step ran eagerly."""

from __future__ import annotations

import time
from collections import Counter, deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from graphrt.capture import optimal_buckets

#: Steps kept by default; older records drop off the ring (counters keep counting).
DEFAULT_CAPACITY = 4096


@dataclass(frozen=True, slots=True)
class StepRecord:
    """One step of :meth:`GraphRuntime.run`.

    ``update_us`` is the host write plus the upload launch. ``launch_us`` is the host time of
    ``graph.replay()``: on CUDA that is the launch only, on the emulated engine the whole
    replay. ``replay_us`` is measured up to a device sync, only when ``Telemetry.sync`` is on.
    A fallback step has ``bucket`` None, zero times and the dispatcher's reason.
    """

    mode: str
    bs: int
    bucket: int | None
    update_us: float
    launch_us: float
    replay_us: float | None = None
    fallback: str | None = None


class Telemetry:
    """A ring of :class:`StepRecord` plus counters over every step ever recorded.

    Parameters
    ----------
    capacity : int
        Records kept.
    sync : bool
        Synchronize the device after each replay to measure ``replay_us``; costs throughput,
        so only demos and debugging turn it on.
    """

    def __init__(self, capacity: int = DEFAULT_CAPACITY, sync: bool = False) -> None:
        # NOTE: the ring holds plain tuples, made into StepRecords only when read: a frozen
        # dataclass is slow to build, and a step builds one whether or not anyone reads it.
        self._ring: deque[tuple] = deque(maxlen=capacity)
        self.sync = sync
        self.fallbacks: Counter[tuple[str, str]] = Counter()
        #: Steps per ``(mode, bs)`` over every step ever recorded (the ring forgets; this does not).
        self.batch_sizes: Counter[tuple[str, int]] = Counter()

    @property
    def steps(self) -> Counter[str]:
        """Steps per mode over every step recorded (summed from :attr:`batch_sizes`).

        NOTE: derived when read, not counted per step: one counter less on the hot path. The
        items are copied first (one C call under the GIL): a step on another thread may add a
        key meanwhile.
        """
        steps: Counter[str] = Counter()
        for (mode, _), n in tuple(self.batch_sizes.items()):
            steps[mode] += n
        return steps

    @property
    def capacity(self) -> int:
        return self._ring.maxlen or 0

    @property
    def records(self) -> tuple[StepRecord, ...]:
        """The steps still in the ring, oldest first."""
        return tuple(StepRecord(*r) for r in self._ring)

    def replayed(
        self, mode: str, bs: int, bucket: int, start: float, updated: float, device: torch.device
    ) -> None:
        """Record a replay whose update began at ``start`` and whose launch began at ``updated``.

        Both are ``time.perf_counter()`` readings; the launch is taken to end now.
        """
        launched = time.perf_counter()
        replay_us = None
        if self.sync:
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            replay_us = (time.perf_counter() - updated) * 1e6
        self.batch_sizes[(mode, bs)] += 1
        self._ring.append((mode, bs, bucket, (updated - start) * 1e6, (launched - updated) * 1e6, replay_us))

    def fell_back(self, mode: str, bs: int, reason: str) -> None:
        """Record a step that ran eagerly because no graph fits it."""
        self.batch_sizes[(mode, bs)] += 1
        self.fallbacks[(mode, reason)] += 1
        self._ring.append((mode, bs, None, 0.0, 0.0, None, reason))

    def histogram(self, mode: str) -> dict[int, int]:
        """Steps per batch size of ``mode``, over every step recorded."""
        return {bs: n for (m, bs), n in self.batch_sizes.items() if m == mode}

    def last_replay(self) -> StepRecord | None:
        """The most recent replayed step still in the ring."""
        last = next((r for r in reversed(self._ring) if r[2] is not None), None)
        return None if last is None else StepRecord(*last)


def step_weights(
    counts: Mapping[tuple[str, int], int],
    modes: Iterable[Any],
    rows_per_req: Callable[[Any], int],
    largest: int,
) -> dict[int, int]:
    """Batch size → pad rows per unit of padding: Σ over ``modes`` of steps × rows per request.

    ``counts`` is :attr:`Telemetry.batch_sizes`; steps of other modes and of more than
    ``largest`` requests (they run eagerly whatever the ladder) are left out. A step of 0
    requests (IDLE) pads to the smallest bucket, as one of 1 does.
    """
    rows = {getattr(m, "name", str(m)): rows_per_req(m) for m in modes}
    weights: Counter[int] = Counter()
    for (mode, bs), n in counts.items():
        if mode in rows and bs <= largest:
            weights[max(bs, 1)] += n * rows[mode]
    return dict(weights)


def ladder_top(max_graphs: int, largest: int | None, allocation: int) -> int:
    """The largest bucket of a suggested ladder (``largest``, default ``allocation``), checked
    along with ``max_graphs``; ``ValueError`` naming the value and its limit."""
    if max_graphs < 1:
        raise ValueError(f"max_graphs must be >= 1, got {max_graphs}")
    top = allocation if largest is None else largest
    if not 1 <= top <= allocation:
        raise ValueError(f"largest bucket {top} is outside 1..{allocation} (max_batch_size)")
    return top


def suggest_ladder(
    counts: Mapping[tuple[str, int], int],
    modes: Iterable[Any],
    rows_per_req: Callable[[Any], int],
    max_graphs: int,
    top: int,
) -> tuple[int, ...]:
    """The ladder of at most ``max_graphs`` buckets up to ``top`` that pads the steps of
    ``counts`` (:func:`step_weights`) least (:func:`graphrt.capture.optimal_buckets`);
    ``ValueError`` when no step of at most ``top`` requests was observed."""
    weights = step_weights(counts, modes, rows_per_req, top)
    if not weights:
        raise ValueError(f"no graphed steps of at most {top} requests observed yet: run() some batches first")
    return optimal_buckets(weights, max_graphs, top)
