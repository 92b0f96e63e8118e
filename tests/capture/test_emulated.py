"""EmulatedEngine keeps CUDA-graph semantics: ops recorded once and replayed on the same tensors."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from graphrt.capture import CaptureSyncError, EmulatedEngine
from tests.capture.values import tensor

# ---- (a) in-place writes to captured inputs are seen ------------------------------------------


def test_replay_sees_in_place_input_writes(engine: EmulatedEngine, device: torch.device) -> None:
    x = tensor([[0, 1, 2], [3, 4, 5]], device)
    graph, out = engine.capture("sum", lambda: (x * 2).sum(0), warmup=1)
    assert out.tolist() == [6, 10, 14]
    ptr = out.data_ptr()

    x.copy_(tensor([[1, 1, 1], [2, 3, 4]], device))
    assert out.tolist() == [6, 10, 14]  # nothing changes until the replay
    graph.replay()
    assert out.tolist() == [6, 8, 10]

    x[1].fill_(-1)  # a partial in-place write through a view of the input
    graph.replay()
    assert out.tolist() == [0, 0, 0]
    assert out.data_ptr() == ptr


def test_replay_chains_intermediates(engine: EmulatedEngine, device: torch.device) -> None:
    x = tensor([1, 2, 3], device)
    w = tensor([10, 100, 1000], device)

    def fn() -> torch.Tensor:
        h = torch.relu(x - 2) * w
        return h.cumsum(0) + x.max()

    graph, out = engine.capture("chain", fn, warmup=0)
    assert out.tolist() == [3, 3, 1003]
    x.copy_(tensor([5, 0, 4], device))
    w.fill_(2)
    graph.replay()
    assert out.tolist() == [11, 11, 15]
    assert fn().tolist() == out.tolist()  # replay agrees with running fn eagerly


# ---- (b) a tensor rebound in Python is not seen -----------------------------------------------


def test_rebound_tensor_not_seen(engine: EmulatedEngine, device: torch.device) -> None:
    state = {"x": tensor([1, 2, 3], device)}
    captured = state["x"]
    graph, out = engine.capture("rebind", lambda: state["x"] * 3, warmup=1)
    assert out.tolist() == [3, 6, 9]

    state["x"] = tensor([5, 5, 5], device)
    graph.replay()
    assert out.tolist() == [3, 6, 9]  # like a CUDA graph: the captured address is read
    assert (state["x"] * 3).tolist() == [15, 15, 15]  # eagerly the new tensor would be used

    captured.fill_(2)  # the tensor the graph holds is still live and read
    graph.replay()
    assert out.tolist() == [6, 6, 6]


# ---- (c) host scalars and branches are frozen at capture --------------------------------------


def test_python_scalar_frozen(engine: EmulatedEngine, device: torch.device) -> None:
    x = tensor([1, 2], device)
    scale = [2]
    graph, out = engine.capture("scalar", lambda: x * scale[0] + scale[0], warmup=1)
    assert out.tolist() == [4, 6]
    scale[0] = 10
    x.copy_(tensor([3, 4], device))
    graph.replay()
    assert out.tolist() == [8, 10]  # still x * 2 + 2


def test_python_branch_frozen(engine: EmulatedEngine, device: torch.device) -> None:
    x = tensor([1, 2], device)
    flag = {"add": True}
    calls = {"add": 0, "sub": 0}

    def fn() -> torch.Tensor:
        if flag["add"]:
            calls["add"] += 1
            return x + 1
        calls["sub"] += 1
        return x - 1

    graph, out = engine.capture("branch", fn, warmup=0)
    flag["add"] = False
    x.fill_(5)
    for _ in range(3):
        graph.replay()
    assert out.tolist() == [6, 6]
    assert calls == {"add": 1, "sub": 0}  # replay never runs Python


def test_shape_from_host_int_frozen(engine: EmulatedEngine, device: torch.device) -> None:
    x = tensor([1, 2, 3, 4], device)
    n = [2]
    graph, out = engine.capture("slice", lambda: x[: n[0]].sum(0, keepdim=True), warmup=0)
    n[0] = 4
    x.fill_(1)
    graph.replay()
    assert out.tolist() == [2]


# ---- (d) host syncs raise during capture --------------------------------------------------------


SYNCS: dict[str, Callable[[torch.Tensor], Any]] = {
    "item": lambda x: x.sum().item(),
    "tolist": lambda x: x.tolist(),
    "nonzero": lambda x: torch.nonzero(x),
    "nonzero_method": lambda x: x.nonzero(),
    "where_1arg": lambda x: torch.where(x > 1),
    "bool_mask": lambda x: x[x > 1],
    "bool_mask_dim1": lambda x: x[:, torch.tensor([True, False, True], device=x.device)],
    "masked_select": lambda x: x.masked_select(x > 1),
    "python_if": lambda x: x * 2 if x.sum() > 0 else x,
    "int": lambda x: int(x[0, 0]),
}


@pytest.mark.parametrize("name", list(SYNCS))
@pytest.mark.parametrize("warmup", [0, 2])
def test_host_sync_raises(engine: EmulatedEngine, device: torch.device, name: str, warmup: int) -> None:
    x = tensor([[0, 1, 2], [3, 4, 5]], device)
    fn = SYNCS[name]
    fn(x)  # fine eagerly (and during warm-up)
    with pytest.raises(CaptureSyncError):
        engine.capture(name, lambda: fn(x), warmup=warmup)
    # the recording modes were left: host reads work again and capture still works
    assert x.tolist() == [[0, 1, 2], [3, 4, 5]]
    _, out = engine.capture("after", lambda: x + 1, warmup=0)
    assert out.tolist() == [[1, 2, 3], [4, 5, 6]]


def test_sync_error_is_a_runtime_error() -> None:
    assert issubclass(CaptureSyncError, RuntimeError)


def test_integer_indexing_is_not_a_sync(engine: EmulatedEngine, device: torch.device) -> None:
    x = tensor([[0, 1, 2], [3, 4, 5]], device)
    idx = tensor([2, 0], device, torch.int64)
    graph, out = engine.capture("gather", lambda: x[:, idx] + x[1, 1:], warmup=0)
    assert out.tolist() == [[6, 5], [9, 8]]
    idx.copy_(tensor([1, 1], device, torch.int64))
    graph.replay()
    assert out.tolist() == [[5, 6], [8, 9]]


# ---- (e) in-place ops on static outputs re-run --------------------------------------------------


def test_in_place_outputs_rerun(engine: EmulatedEngine, device: torch.device) -> None:
    src = tensor([1, 2, 3, 4], device)
    idx = tensor([0, 2], device, torch.int64)
    vals = tensor([10, 20], device)
    scattered, copied, cum, summed = (torch.zeros(4, device=device) for _ in range(4))

    def fn() -> None:
        scattered.zero_()
        scattered.index_put_((idx,), vals)
        copied.copy_(src * 2)
        torch.cumsum(src, 0, out=cum)
        torch.add(src, scattered, out=summed)
        summed.mul_(2)

    graph, out = engine.capture("inplace", fn, warmup=1)
    assert out is None
    assert scattered.tolist() == [10, 0, 20, 0]
    assert copied.tolist() == [2, 4, 6, 8]
    assert cum.tolist() == [1, 3, 6, 10]
    assert summed.tolist() == [22, 4, 46, 8]

    src.copy_(tensor([4, 3, 2, 1], device))
    idx.copy_(tensor([3, 1], device, torch.int64))
    vals.copy_(tensor([7, 8], device))
    for t in (scattered, copied, cum, summed):
        t.fill_(-1)  # stale values a replay must overwrite
    graph.replay()
    assert scattered.tolist() == [0, 8, 0, 7]
    assert copied.tolist() == [8, 6, 4, 2]
    assert cum.tolist() == [4, 7, 9, 10]
    assert summed.tolist() == [8, 22, 4, 16]


def test_in_place_accumulation_replays_once_per_replay(engine: EmulatedEngine, device: torch.device) -> None:
    counter = tensor([0], device)
    graph, _ = engine.capture("acc", lambda: counter.add_(1), warmup=2)
    assert counter.tolist() == [3]  # two warm-ups and the recording run
    for _ in range(4):
        graph.replay()
    assert counter.tolist() == [7]


# ---- (f) views of intermediates follow their base -------------------------------------------


def test_views_of_intermediates_update(engine: EmulatedEngine, device: torch.device) -> None:
    x = torch.arange(8, dtype=torch.float32, device=device)

    def fn() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        y = x * 3
        return y[2:5], y.view(2, 4)[:, 1], y.view(2, 4).t()

    graph, (part, column, transposed) = engine.capture("views", fn, warmup=0)
    assert part.tolist() == [6, 9, 12]
    assert column.tolist() == [3, 15]
    x.copy_(torch.arange(8, 0, -1, dtype=torch.float32, device=device))
    graph.replay()
    assert part.tolist() == [18, 15, 12]
    assert column.tolist() == [21, 9]
    assert transposed.tolist() == [[24, 12], [21, 9], [18, 6], [15, 3]]


def test_in_place_write_through_a_view(engine: EmulatedEngine, device: torch.device) -> None:
    x = tensor([1, 2, 3, 4], device)

    def fn() -> torch.Tensor:
        y = x + 10
        y[:2].zero_()
        return y

    graph, out = engine.capture("view_write", fn, warmup=0)
    assert out.tolist() == [0, 0, 13, 14]
    x.fill_(0)
    graph.replay()
    assert out.tolist() == [0, 0, 10, 10]
