"""Many requests' KV pages as one table, so the slots of their positions take one numpy op."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np


def page_table(reqs: Sequence[Any]) -> np.ndarray:
    """``[len(reqs), most pages]`` int64: row ``i`` holds ``reqs[i].pages``.

    NOTE: padded with -1, never a page: a position past a request's pages gets a negative slot,
    which the runtime's checks refuse (as ``Request.at`` would fail), instead of another page.
    """
    width = max((len(r.pages) for r in reqs), default=1)
    table = np.full((len(reqs), width), -1, dtype=np.int64)
    for i, r in enumerate(reqs):
        table[i, : len(r.pages)] = r.pages
    return table


def slots_at(table: np.ndarray, rows: np.ndarray, pos: np.ndarray, page_size: int) -> np.ndarray:
    """The KV slot of position ``pos`` of request ``rows`` (indices into ``table``; same
    shapes, or broadcasting): ``Request.at`` for many requests at once."""
    return table[rows, pos // page_size] * page_size + pos % page_size
