"""The emulated engine's pool (``capture/emulated_pool.py``): recording holds no intermediate,
the recorded ones share memory by live range, a replay still computes what eager does, and what
escapes the capture keeps its own storage."""

from __future__ import annotations

import torch
from torch.multiprocessing.reductions import StorageWeakRef

from graphrt.capture import EmulatedEngine


def _chain(x: torch.Tensor, n: int) -> torch.Tensor:
    y = x
    for i in range(n):
        y = y * 1.5 + i  # NOTE: two intermediates a link, each dead after the next op
    return y.sum(0)


def test_a_chain_keeps_its_peak_not_its_sum() -> None:
    x = torch.randn(64, 256)
    graph, out = EmulatedEngine().capture("chain", lambda: _chain(x, 20), warmup=0)
    tile = 64 * 256 * 4
    assert graph.info.pool_bytes <= 2 * tile + 256 * 4, "two live [64, 256] tiles at most, not 40"
    for _ in range(3):
        x.copy_(torch.randn(64, 256))
        graph.replay()
        torch.testing.assert_close(out, _chain(x, 20), rtol=0, atol=0)


def test_an_escaped_workspace_keeps_its_values() -> None:
    """A tensor made during capture and kept by an object (a workspace, a cache) is not shared:
    later intermediates of the same size must not overwrite it."""
    x, kept = torch.randn(32, 32), {}

    def fn() -> torch.Tensor:
        kept["ws"] = x * 2
        return _chain(x, 5)

    graph, out = EmulatedEngine().capture("ws", fn, warmup=0)
    x.copy_(torch.randn(32, 32))
    graph.replay()
    torch.testing.assert_close(kept["ws"], x * 2, rtol=0, atol=0)
    torch.testing.assert_close(out, _chain(x, 5), rtol=0, atol=0)


def test_an_escaped_view_keeps_its_base() -> None:
    x, kept = torch.randn(8, 16), {}

    def fn() -> torch.Tensor:
        y = x + 1
        kept["row"] = y[3]  # NOTE: a view the recorded ops never read
        return _chain(x, 5)

    graph, _ = EmulatedEngine().capture("view", fn, warmup=0)
    x.copy_(torch.randn(8, 16))
    graph.replay()
    torch.testing.assert_close(kept["row"], x[3] + 1, rtol=0, atol=0)


def test_recording_holds_no_intermediate() -> None:
    """A dead intermediate's memory is freed while the capture records (the capture's peak is the
    program's, not the sum of its intermediates), and replays still compute it."""
    x, freed = torch.randn(16, 16), []

    def fn() -> torch.Tensor:
        y = x * 2
        ref = StorageWeakRef(y.untyped_storage())
        z = y + 1
        del y
        freed.append(ref.expired())  # NOTE: still recording
        return z.sum(0)

    graph, out = EmulatedEngine().capture("dead", fn, warmup=0)
    assert freed == [True], "the recorder kept x * 2 alive"
    x.copy_(torch.randn(16, 16))
    graph.replay()
    torch.testing.assert_close(out, (x * 2 + 1).sum(0), rtol=0, atol=0)
