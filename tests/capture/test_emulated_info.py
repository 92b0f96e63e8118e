"""EmulatedEngine's graph facts: GraphInfo (kernels, nodes), warm-up before recording, gc frozen."""

from __future__ import annotations

import gc

import pytest
import torch

from graphrt.capture import EmulatedEngine, KernelCount
from tests.capture.values import tensor

# ---- (g) GraphInfo ------------------------------------------------------------------------------


def test_graph_info(engine: EmulatedEngine, device: torch.device) -> None:
    x = tensor([[0, 1, 2], [3, 4, 5]], device)
    graph, _ = engine.capture(("decode", 4), lambda: (x * 2).sum(0), warmup=0)
    info = graph.info
    assert info.key == ("decode", 4)
    assert info.kernels == (KernelCount("mul", 1), KernelCount("sum", 1))
    assert info.num_nodes == 2
    assert info.pool_bytes == 64 + 3 * 4  # x * 2 in one 64-byte slot; the output its own
    assert info.replays == 0
    for i in range(1, 4):
        graph.replay()
        assert info.replays == i


def test_graph_info_counts_repeated_ops(engine: EmulatedEngine, device: torch.device) -> None:
    x = tensor([1, 2, 3], device)

    def fn() -> torch.Tensor:
        y = x + 1
        y = y + 1
        y = y + 1
        return y[1:].sum()

    graph, out = engine.capture("repeat", fn, warmup=0)
    assert out.tolist() == 11
    counts = {k.name: k.count for k in graph.info.kernels}
    assert counts == {"add": 3, "slice": 1, "sum": 1}
    assert graph.info.num_nodes == 5
    assert all(k.launch == "" for k in graph.info.kernels)


# ---- (h) warm-up ---------------------------------------------------------------------------------


@pytest.mark.parametrize("warmup", [0, 1, 3])
def test_warmup_runs_fn_before_recording(engine: EmulatedEngine, warmup: int) -> None:
    calls = [0]
    x = torch.ones(2)

    def fn() -> torch.Tensor:
        calls[0] += 1
        return x * calls[0]

    graph, out = engine.capture("warm", fn, warmup=warmup)
    assert calls[0] == warmup + 1
    assert out.tolist() == [warmup + 1] * 2  # the recorded run is the last one
    for _ in range(3):
        graph.replay()
    assert calls[0] == warmup + 1
    assert out.tolist() == [warmup + 1] * 2  # the host counter was frozen at the recorded run


# ---- gc -------------------------------------------------------------------------------------------


def test_frozen_gc(engine: EmulatedEngine) -> None:
    gc.unfreeze()
    assert gc.get_freeze_count() == 0
    with engine.frozen_gc():
        assert gc.get_freeze_count() > 0
    assert gc.get_freeze_count() == 0
    with pytest.raises(KeyError), engine.frozen_gc():
        assert gc.get_freeze_count() > 0
        raise KeyError("boom")
    assert gc.get_freeze_count() == 0
