"""A small CPU runtime with replays, a fallback and a parity sweep, snapshotted for the tests."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from graphrt.debug.parity import parity_sweep
from graphrt.debug.snapshot import Snapshot, take_snapshot
from tests.support.util import Setup, build_runtime, decode_batch, prefill

#: Largest bucket 4; bs 5 falls back to eager with the reason "bs 5 > largest bucket 4".
BUCKETS = (1, 2, 4)
LAST_BS = 3  # the parity sweep's last step: bucket 4, bs 3


def snapshot_setup() -> Setup:
    setup = build_runtime(
        torch.device("cpu"), buckets=BUCKETS, max_batch_size=4, max_reqs=6, max_context_len=64
    )
    rng = np.random.default_rng(0)
    prefill(setup, range(5), [9, 4, 7, 3, 5], rng)
    for reqs, lens in (([0, 1], [10, 5]), ([0, 1, 2, 3, 4], [11, 6, 8, 4, 6])):
        setup.runtime.run(decode_batch(setup, reqs, lens, rng))
    return setup


def take(directory: Path, corrupt: bool = False) -> tuple[Setup, Snapshot, Path]:
    """Snapshot after the sweep; ``corrupt`` breaks the pad rule of ``cache_seqlens`` row 3."""
    setup = snapshot_setup()
    parity = parity_sweep(setup.runtime)
    if corrupt:
        setup.runtime.buffers.full["cache_seqlens"][LAST_BS] = 99
    path = directory / "snap.json"
    snap = take_snapshot(
        setup.runtime, str(path), environment={"device": "cpu", "torch": torch.__version__}, parity=parity
    )
    return setup, snap, path
