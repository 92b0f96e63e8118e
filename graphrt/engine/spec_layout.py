"""One running set's round arrays, made once: what every overlapped round of it shares.

An overlapped speculative engine (:mod:`.spec_ahead`) builds a batch every step, and most steps
of a backed-off engine are fed DECODEs of the same requests. Their rows, page table, sampling
parameters and ``FED`` input ids depend only on which requests run (a request's pages are
fixed at admission), so, as :class:`~graphrt.engine.batches.DecodeRows` does for the plain
loop, they become arrays once per running set instead of loops over the requests each step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from graphrt.engine.pages import page_table
from graphrt.engine.sampling import row_params
from graphrt.step.batch import FED, PAD_DRAFT
from graphrt.step.sampling import SamplingParams


def _frozen(arr: np.ndarray) -> np.ndarray:
    """``arr`` made read-only: every batch of the running set shares it."""
    arr.flags.writeable = False
    return arr


@dataclass(frozen=True, slots=True)
class RoundLayout:
    """The arrays of one running set (``reqs``, in batch order) that its rounds share.

    ``rows [bs]`` int64 request rows; ``table [bs, pages]`` their page table; ``sampling``
    their sampling parameters; ``fed [bs]`` a fed DECODE's input ids (all ``FED``); ``pads
    [bs, steps]`` drafts of a round where no row drafts (all ``PAD_DRAFT``); ``index [bs]``
    ``0 .. bs-1``.
    """

    reqs: list[Any]
    rows: np.ndarray
    table: np.ndarray
    sampling: tuple[SamplingParams, ...]
    fed: np.ndarray
    pads: np.ndarray
    index: np.ndarray

    @classmethod
    def of(cls, reqs: list[Any], steps: int) -> RoundLayout:
        bs = len(reqs)
        return cls(
            reqs=list(reqs),
            rows=_frozen(np.array([r.req_idx for r in reqs], dtype=np.int64)),
            table=_frozen(page_table(reqs)),
            sampling=row_params([r.sampling for r in reqs]),
            fed=_frozen(np.full(bs, FED, dtype=np.int64)),
            pads=_frozen(np.full((bs, steps), PAD_DRAFT, dtype=np.int64)),
            index=_frozen(np.arange(bs)),
        )


class Layouts:
    """The :class:`RoundLayout` of the running set last asked for, rebuilt when it changes."""

    def __init__(self, steps: int) -> None:
        self.steps = steps
        self._last: RoundLayout | None = None
        self._ids: tuple[int, ...] = ()

    def get(self, reqs: list[Any]) -> RoundLayout:
        """``reqs``' layout: the same requests in the same order reuse the arrays (a request's
        row is fixed while it runs; one giving it back leaves the planned set, which then
        differs). NOTE: compared by ``id``: the layout holds the requests, so no id is reused
        while it is kept."""
        ids = tuple(map(id, reqs))
        if self._last is None or ids != self._ids:
            self._last, self._ids = RoundLayout.of(reqs, self.steps), ids
        return self._last
