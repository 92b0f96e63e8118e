"""A capture engine with CUDA-graph semantics for machines without a GPU.

Capture runs ``fn`` once under a dispatch mode that records every aten op with its exact
arguments. Replay re-runs the recorded ops on the *same* tensors: results of functional ops
are copied into the tensors captured as their outputs, in-place ops write their captured
targets again, and views are not re-run (they alias storage that replay already updates).
So, as with a CUDA graph, a replay sees in-place writes to captured inputs, never a tensor
rebound in Python; Python scalars and branches are frozen at their capture values; and host
syncs (``.item()``, ``.tolist()``, ``nonzero``, boolean masks) raise during capture.
"""

from __future__ import annotations

import gc
import time
from collections import Counter
from collections.abc import Callable, Hashable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

from graphrt.capture.graph import GraphInfo, KernelCount

aten = torch.ops.aten

#: Ops that need the device's values on the host, or whose output shape depends on data.
SYNC_OPS = frozenset(
    {
        aten._local_scalar_dense.default,
        aten.nonzero.default,
        aten.nonzero_static.default,
        aten.masked_select.default,
        aten.is_nonzero.default,
        aten.equal.default,
        aten.unique_consecutive.default,
        aten._unique2.default,
    }
)


#: Ops that sync when one of their indices is a boolean mask (it is turned into ``nonzero``).
MASK_OPS = frozenset({aten.index.Tensor})


class CaptureSyncError(RuntimeError):
    """A host sync or data-dependent shape inside a captured region."""


def _has_mask(func: Any, args: tuple) -> bool:
    if func not in MASK_OPS:
        return False
    return any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in args[1])


class _HostReads(TorchFunctionMode):
    # NOTE: ``Tensor.tolist`` reads a CPU tensor's memory below the dispatcher, so the
    # recorder never sees it; refuse it one level up.
    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is torch.Tensor.tolist:
            raise CaptureSyncError("Tensor.tolist needs a host sync; it cannot be captured")
        return func(*args, **(kwargs or {}))


@dataclass(frozen=True, slots=True)
class _Op:
    func: Any
    args: tuple
    kwargs: dict
    outs: tuple[torch.Tensor, ...]  # tensors captured as outputs (written on replay)
    rerun: bool  # False for views: their storage is updated by the ops that write it


def _is_view(func: Any) -> bool:
    returns = func._schema.returns
    return bool(returns) and all(r.alias_info is not None and not r.alias_info.is_write for r in returns)


def _mutates(func: Any) -> bool:
    return any(a.alias_info is not None and a.alias_info.is_write for a in func._schema.arguments)


class _Recorder(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops: list[_Op] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in SYNC_OPS or _has_mask(func, args):
            raise CaptureSyncError(
                f"{func} needs a host sync or a data-dependent shape; it cannot be captured"
            )
        out = func(*args, **kwargs)
        view, mutates = _is_view(func), _mutates(func)
        outs = (
            () if (view or mutates) else tuple(t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor))
        )
        self.ops.append(_Op(func, args, kwargs, outs, rerun=not view))
        return out


class EmulatedGraph:
    """The recorded op list of one captured region."""

    def __init__(self, ops: list[_Op], info: GraphInfo) -> None:
        self._ops = [op for op in ops if op.rerun]
        self.info = info

    def replay(self) -> None:
        with torch.no_grad():
            for op in self._ops:
                out = op.func(*op.args, **op.kwargs)
                if op.outs:
                    for dst, src in zip(op.outs, tree_flatten(out)[0], strict=False):
                        dst.copy_(src)
        self.info.replays += 1


class EmulatedEngine:
    """Capture engine for CPU (or any device) that keeps CUDA-graph semantics."""

    name = "emulated"

    @contextmanager
    def frozen_gc(self) -> Iterator[None]:
        gc.collect()
        gc.freeze()
        try:
            yield
        finally:
            gc.unfreeze()

    def capture(self, key: Hashable, fn: Callable[[], Any], warmup: int) -> tuple[EmulatedGraph, Any]:
        warm = time.perf_counter()
        for _ in range(warmup):
            fn()
        start = time.perf_counter()
        recorder = _Recorder()
        with torch.no_grad(), _HostReads(), recorder:
            out = fn()
        ops = recorder.ops
        counts = Counter(str(op.func.overloadpacket.__name__) for op in ops)
        kernels = tuple(KernelCount(name, n) for name, n in counts.items())
        nbytes = _owned_bytes(ops)
        info = GraphInfo(key, time.perf_counter() - start, nbytes, len(ops), kernels)
        info.warmup_seconds = start - warm  # NOTE: nothing to instantiate: the op list is the graph
        out = tree_map(lambda x: x, out)
        return EmulatedGraph(ops, info), out


def _owned_bytes(ops: list[_Op]) -> int:
    """Bytes of the intermediates the graph keeps alive (its 'pool')."""
    seen: dict[int, int] = {}
    for op in ops:
        for t in op.outs:
            st = t.untyped_storage()
            seen[st.data_ptr()] = st.nbytes()
    return sum(seen.values())
