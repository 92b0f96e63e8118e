"""``graphrt inspect`` of a lazily capturing runtime: which graphs exist, which are pending."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from graphrt.cli import main
from graphrt.debug.snapshot import PendingFacts, load_snapshot, take_snapshot
from tests.support.util import build_runtime, decode_batch, next_lens, prefill


def test_inspect_lists_captured_and_pending_graphs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    s = build_runtime(torch.device("cpu"), buckets=(1, 2, 4), max_batch_size=4, max_context_len=64, lazy=True)
    prefill(s, [0, 1], [5, 6], np.random.default_rng(0))
    s.runtime.run(decode_batch(s, [0, 1], next_lens(s, [0, 1]), np.random.default_rng(1)))
    path = tmp_path / "lazy.json"
    take_snapshot(s.runtime, str(path), environment={"device": "cpu", "torch": torch.__version__})
    snap = load_snapshot(path)
    assert [(g.mode, g.bucket) for g in snap.graphs] == [("DECODE", 2)]
    assert snap.pending == (PendingFacts("DECODE", 4), PendingFacts("DECODE", 1))
    assert snap.config["capture"] == "lazy"
    assert main(["inspect", str(path), "--width", "160", "--no-kernels"]) == 0
    grid = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("│ DECODE │")]
    assert [(c[2].strip(), c[3].strip()) for c in (ln.split("│") for ln in grid)] == [
        ("1", "pending"),
        ("2", "yes"),
        ("4", "pending"),
    ]
