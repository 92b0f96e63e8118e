"""The scheduler as a step's parts see it: :class:`StepState`, the state that :mod:`.step_run` and
:mod:`.spec_ahead` read and the moves that keep it whole, and :class:`StepCounts`, the counters
every kind of step adds to.

:class:`~graphrt.engine.scheduler.Scheduler` is the one implementation; the parts name this
contract instead of the scheduler, so the scheduler imports them and none of them imports it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from graphrt.engine.batches import DecodeRows
from graphrt.engine.extras import StepExtras
from graphrt.engine.overlap import Launched
from graphrt.engine.request import Request


@dataclass(slots=True)
class StepCounts:
    """An engine's step counters (:class:`~graphrt.engine.stats.EngineStats` reports them).

    ``decode_seconds`` sums the wall time of decode steps (mixed steps holding decode rows
    included); ``mixed_steps``: chunked steps holding decode rows and prompt chunks.
    """

    prefill_steps: int = 0
    decode_steps: int = 0
    decode_seconds: float = 0.0
    mixed_steps: int = 0

    def decoded(self, start: float) -> None:
        """One decode step (or speculative round) that began at ``start`` (``perf_counter``)."""
        self.decode_seconds += time.perf_counter() - start
        self.decode_steps += 1

    def step(self, prefilled: bool, decoded: bool, start: float) -> None:
        """One overlapped engine step: a prefill step, else (``decoded``) a decode step."""
        if prefilled:
            self.prefill_steps += 1
        elif decoded:
            self.decoded(start)


class StepState(Protocol):
    """What a step's parts use of the scheduler that runs them.

    ``running``: the requests in the batch, in admission order; ``logits``: per request id, the
    rows an engine with ``record_logits`` recorded; ``runtime``: the ``GraphRuntime``;
    ``rows``: the running set's DECODE rows, None whenever the set changes (a request joins,
    leaves or gives its row back).
    """

    runtime: Any
    extras: StepExtras
    use_graphs: bool
    record_logits: bool
    page_size: int
    running: list[Request]
    logits: dict[int, list[torch.Tensor]]
    counts: StepCounts
    rows: DecodeRows | None

    def admit(self) -> list[Request]:
        """Move the waiting requests that fit into ``running``; returns them."""
        ...

    def mark_prefilled(self, r: Request) -> None:
        """``r``'s whole prompt is in its KV now (its full pages go to the prefix cache)."""
        ...

    def take(self, step: Launched | None) -> tuple[list[tuple[int, int]], list[Request]]:
        """Append a read overlapped step's tokens; returns them and the requests they ended."""
        ...

    def retire(self, done: list[Request]) -> None:
        """Move ``done`` from ``running`` to the finished requests."""
        ...

    def release(self, r: Request) -> None:
        """Give ``r``'s request row and pages back (its last step is launched)."""
        ...

    def forget_rows(self) -> None:
        """The running requests' positions moved outside the decode rows: lay them out anew."""
        ...
