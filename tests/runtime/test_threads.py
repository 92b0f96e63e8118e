"""One runtime, two threads: ``run()`` serialises its callers, so every output equals eager."""

from __future__ import annotations

import threading

import numpy as np
import torch

from graphrt import Batch
from tests.runtime.test_decode_parity import tolerance
from tests.support.util import Setup, build_runtime, decode_batch, prefill

STEPS = 100
PROMPT = 8


def _setup(device: torch.device) -> Setup:
    s = build_runtime(device, max_context_len=128, max_reqs=4, buckets=(1, 2))
    prefill(s, [0, 1], [PROMPT, PROMPT + 3], np.random.default_rng(0))
    return s


def _steps(s: Setup, row: int, start: int, seed: int) -> list[Batch]:
    """``STEPS`` consecutive DECODE steps of one row (positions ``start ...``)."""
    rng = np.random.default_rng(seed)
    return [decode_batch(s, [row], [start + i + 1], rng) for i in range(STEPS)]


def test_two_threads_get_eager_outputs(device: torch.device) -> None:
    graphed, oracle = _setup(device), _setup(device)
    work = {0: _steps(graphed, 0, PROMPT, 1), 1: _steps(graphed, 1, PROMPT + 3, 2)}
    outputs: dict[int, list[torch.Tensor]] = {0: [], 1: []}
    errors: list[BaseException] = []
    barrier = threading.Barrier(2)

    def caller(row: int) -> None:
        try:
            barrier.wait()
            for batch in work[row]:
                outputs[row].append(graphed.runtime.run(batch))
        except BaseException as exc:  # NOTE: a thread's exception would otherwise be lost
            errors.append(exc)

    threads = [threading.Thread(target=caller, args=(row,)) for row in work]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert graphed.runtime.stats().replays == {"DECODE": 2 * STEPS}
    # NOTE: rows are independent, so each row's steps replayed in order reproduce its outputs.
    for row, batches in work.items():
        for i, batch in enumerate(batches):
            expected = oracle.runtime.run(batch, eager=True)
            torch.testing.assert_close(
                outputs[row][i], expected, **tolerance(device), msg=f"row {row} step {i}"
            )
