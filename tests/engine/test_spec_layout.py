"""The overlapped rounds' per-running-set arrays (:mod:`graphrt.engine.spec_layout`): exact
contents, reused for the same requests, rebuilt when the set or its order changes."""

from __future__ import annotations

import numpy as np

from graphrt.engine.batches import DecodeRows, RunningArrays
from graphrt.engine.request import Request
from graphrt.engine.spec_layout import Layouts
from graphrt.step.sampling import SamplingParams


def _reqs() -> list[Request]:
    stop = SamplingParams(stop_token_ids=(7, 9))
    return [
        Request(0, [1, 2], 5, req_idx=3, pages=[4, 5], sampling=stop),
        Request(1, [1], 8, req_idx=0, pages=[6]),
    ]


def test_layout_arrays() -> None:
    reqs = _reqs()
    layout = Layouts().get(reqs)
    assert layout.rows.tolist() == [3, 0]
    assert layout.table.tolist() == [[4, 5], [6, -1]]
    assert layout.index.tolist() == [0, 1]
    assert layout.sampling[0].stop_token_ids == (7, 9)
    assert not layout.rows.flags.writeable  # NOTE: shared by every batch of the set


def test_layout_reused_then_rebuilt() -> None:
    reqs, layouts = _reqs(), Layouts()
    first = layouts.get(reqs)
    assert layouts.get(list(reqs)) is first  # the same requests, another list
    swapped = layouts.get(reqs[::-1])
    assert swapped is not first and swapped.rows.tolist() == [0, 3]
    fewer = layouts.get(reqs[1:])
    assert np.array_equal(fewer.rows, [0]) and fewer.table.shape == (1, 1)


def test_decode_rows_and_rounds_share_one_layout_of_the_set() -> None:
    reqs = _reqs()
    layout, rows = Layouts().get(reqs), DecodeRows(reqs, 4, sampled=False)
    assert isinstance(layout, RunningArrays) and isinstance(rows.arrays, RunningArrays)
    for name in ("rows", "table", "index"):
        assert np.array_equal(getattr(rows.arrays, name), getattr(layout, name)), name
        assert not getattr(rows.arrays, name).flags.writeable, name
    assert rows.sampling is None and layout.sampling is not None  # only a sampled set has them
