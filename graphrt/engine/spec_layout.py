"""An overlapped verify round's data: its running set's arrays (made once), its plan, its flights.

An overlapped speculative engine (:mod:`.spec_ahead`) launches a TARGET_VERIFY whenever a row
drafts. Its rows, page table and sampling parameters depend only on which requests run (a
request's pages are fixed at admission), so, as :class:`~graphrt.engine.batches.DecodeRows`
does for DECODE steps (the rounds where no row drafts), they become arrays once per running
set instead of loops over the requests each round. :class:`Plan`, :class:`Round` and
:class:`Flight` are what :mod:`.spec_ahead` builds, launches and tracks per request.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from graphrt.engine.batches import RunningArrays
from graphrt.step.batch import FED, PAD_DRAFT


@dataclass(frozen=True, slots=True)
class RoundLayout(RunningArrays):
    """The arrays of one running set (``reqs``, in batch order) that its verify rounds share:
    :class:`~graphrt.engine.batches.RunningArrays`, always with ``sampling`` (a verify round
    samples in its graph). Made by :class:`Layouts`, kept while the set runs unchanged."""


class Layouts:
    """The :class:`RoundLayout` of the running set last asked for, rebuilt when it changes."""

    def __init__(self) -> None:
        self._last: RoundLayout | None = None
        self._ids: tuple[int, ...] = ()

    def get(self, reqs: list[Any]) -> RoundLayout:
        """``reqs``' layout: the same requests in the same order reuse the arrays (a request's
        row is fixed while it runs; one giving it back leaves the planned set, which then
        differs). NOTE: compared by ``id``: the layout holds the requests, so no id is reused
        while it is kept."""
        ids = tuple(map(id, reqs))
        if self._last is None or ids != self._ids:
            self._last, self._ids = RoundLayout.of(reqs, sampled=True), ids
        return self._last


@dataclass(slots=True)
class Flight:
    """A request's part in a launched step not read yet: it starts with ``base`` tokens
    committed (its pending token at position ``base - 1``) and offers ``drafts``. ``valid``
    turns False when the step before it is read and committed other than assumed."""

    step: object
    base: int
    drafts: tuple[int, ...]
    valid: bool = True

    @property
    def next_base(self) -> int:
        """The next round's ``base``, assuming this step accepts every draft it offers."""
        return self.base + len(self.drafts) + 1


@dataclass(slots=True)
class Round:
    """A launched verify round: its requests' flights and where its tokens arrive
    (``[bs, nodes]``: the target's token after every node)."""

    reqs: list[Any]
    flights: list[Flight]
    host: np.ndarray  # [bs, nodes] int64: a view of the ring's buffer (pinned on CUDA)
    copied: Any  # torch.cuda.Event, or None (CPU: already there)

    def read(self) -> list[list[int]]:
        """The round's tokens, a list per row (a copy: the ring's buffer is filled again):
        the host compares them with its drafts token by token."""
        if self.copied is not None:
            self.copied.synchronize()
        return self.host.tolist()


@dataclass(frozen=True, slots=True)
class Plan:
    """One verify round's rows as the host builds it: their layout (requests, rows, pages),
    bases (tokens committed before the round, per row) and chains (each row's drafts, at
    most ``steps``; empty: a pad row, ``PAD_DRAFT`` nodes).

    NOTE: lists, not arrays: the chains come from the proposers as lists and become the
    flights' tuples; the round's input ids are one array made from them (:meth:`input_ids`).
    """

    layout: RoundLayout
    base: list[int]
    chains: list[list[int]]

    def input_ids(self, steps: int) -> np.ndarray:
        """``[bs * (steps + 1)]`` int64 request-major: ``FED`` (node 0), the chain, pads."""
        pads = [PAD_DRAFT] * steps
        return np.array([[FED, *c, *pads[len(c) :]] for c in self.chains], dtype=np.int64).reshape(-1)
