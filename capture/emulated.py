"""A capture engine with CUDA-graph semantics for machines without a GPU.

Capture runs ``fn`` once under a dispatch mode that records every aten op with its exact
arguments. Replay re-runs the recorded ops on the *same* tensors: results of functional ops
are copied into the tensors captured as their outputs, in-place ops write their captured
targets again, and views are not re-run (they alias storage that replay already updates).
Intermediates are not held while recording, and those whose lives do not overlap share memory
once recorded, as in a CUDA graph's private pool (:mod:`.emulated_pool`). So, as with a CUDA graph, a replay sees in-place writes to captured
inputs, never a tensor rebound in Python; Python scalars and branches are frozen at their
capture values; and what a CUDA stream capture rejects raises :class:`CaptureSyncError` naming
the op: host syncs (``.item()``, ``.tolist()``, ``nonzero``, ``x[mask]``, ``x[mask] = v``),
device-to-host copies (``.cpu()``, ``.numpy()``, ``.to("cpu")``, ``copy_`` into host memory)
and data-dependent sizes (``repeat_interleave`` without ``output_size``, ``bincount``,
``unique``).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Hashable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

from graphrt.capture.emulated_pool import Pool
from graphrt.capture.graph import GraphInfo, KernelCount, frozen_gc
from graphrt.capture.topology import ops_topology, requests_pdl, with_pdl

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
        aten._unique.default,
        aten._unique2.default,
        aten.unique_dim.default,
        aten.bincount.default,
    }
)


#: Ops that sync when one of their indices is a boolean mask (it is turned into ``nonzero``):
#: ``x[mask]`` and ``x[mask] = v``.
MASK_OPS = frozenset({aten.index.Tensor, aten.index_put_.default, aten.index_put.default})
#: Copies that move data to the host when their source is on a device.
COPY_OPS = frozenset({aten.copy_.default, aten._to_copy.default})


class CaptureSyncError(RuntimeError):
    """A host sync, device-to-host copy or data-dependent shape inside a captured region."""


def _has_mask(func: Any, args: tuple) -> bool:
    if func not in MASK_OPS:
        return False
    masks = [i for i in args[1] if isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8)]
    if not masks:
        return False
    # NOTE: ``x[mask] = scalar`` (one mask, a one-element value) is a masked_fill for CUDA: no sync.
    scalar = func is not aten.index.Tensor and len(args[1]) == 1 and args[2].numel() == 1
    return not scalar


def _refusal(func: Any, args: tuple, kwargs: dict) -> str | None:
    """Why a CUDA stream capture would reject ``func``, or None."""
    if func in SYNC_OPS or _has_mask(func, args):
        return "needs a host sync or a data-dependent shape"
    if func is aten.repeat_interleave.Tensor and kwargs.get("output_size") is None:
        return "sizes its output from tensor data (pass output_size)"
    if func in COPY_OPS:
        src = args[1] if func is aten.copy_.default else args[0]
        dst = args[0].device if func is aten.copy_.default else kwargs.get("device") or src.device
        if src.device.type != "cpu" and torch.device(dst).type == "cpu":
            return f"copies {src.device} memory to the host"
    return None


def _to_host(args: tuple, kwargs: dict) -> bool:
    """``Tensor.to`` aimed at the host: the string ``"cpu"``, or a CPU device or tensor that
    is not the tensor's own device (a device-to-host copy)."""
    own = args[0].device
    for a in (*args[1:], kwargs.get("device")):
        if isinstance(a, str) and torch.device(a).type == "cpu":
            return True
        target = a.device if isinstance(a, torch.Tensor) else a
        if isinstance(target, torch.device) and target.type == "cpu" and own.type != "cpu":
            return True
    return False


#: Tensor methods that hand device memory to the host below the dispatcher (or as a no-op
#: on a CPU tensor), refused one level up.
HOST_METHODS = {
    torch.Tensor.tolist: "Tensor.tolist",
    torch.Tensor.cpu: "Tensor.cpu",
    torch.Tensor.numpy: "Tensor.numpy",
    torch.Tensor.__array__: "Tensor.__array__ (numpy conversion)",
}


class _HostReads(TorchFunctionMode):
    # NOTE: on a CPU tensor ``.cpu()``, ``.numpy()`` and ``.tolist()`` never reach the
    # dispatcher, yet on a GPU each is a device-to-host copy a stream capture rejects.
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = HOST_METHODS.get(func)
        if name is None and func is torch.Tensor.to and _to_host(args, kwargs):
            name = "Tensor.to(cpu)"
        if name is not None:
            raise CaptureSyncError(f"{name} needs a host sync (device-to-host copy); it cannot be captured")
        return func(*args, **kwargs)


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


def _returns_fresh(func: Any) -> bool:
    """Whether the op returns a tensor that aliases none of its arguments (copied into on replay):
    not a view, nor an in-place or ``out=`` op, whose returns are their targets; an op that
    writes an argument and returns a new tensor too (``graphrt::decode_attention`` storing the new
    keys) does."""
    return any(r.alias_info is None for r in func._schema.returns)


class _Recorder(TorchDispatchMode):
    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # NOTE: by default torch wraps ``__torch_dispatch__`` in ``torch._dynamo.disable``,
        # which imports dynamo (1 s of the first capture) and adds a frame to every op;
        # nothing here is ever compiled.
        return False

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[_Op] = []
        #: Holds no intermediate while recording (:mod:`.emulated_pool`).
        self.pool = Pool()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        why = _refusal(func, args, kwargs)
        if why is not None:
            raise CaptureSyncError(f"{func} {why}; it cannot be captured")
        out = func(*args, **kwargs)
        fresh = _returns_fresh(func)
        outs = tuple(t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)) if fresh else ()
        i, pool = len(self.ops), self.pool
        outs = pool.made(outs, i)
        self.ops.append(
            _Op(func, pool.record(args, i), pool.record(kwargs, i), outs, rerun=not _is_view(func))
        )
        return out

    def finish(self) -> tuple[list[_Op], int]:
        """The ops to replay, on the pool's tensors, and the bytes the graph keeps."""
        tensor_of, nbytes = self.pool.finish()
        ops = [
            _Op(op.func, tensor_of(op.args), tensor_of(op.kwargs), tensor_of(op.outs), op.rerun)
            for op in self.ops
            if op.rerun
        ]
        return ops, nbytes


class EmulatedGraph:
    """The recorded op list of one captured region."""

    def __init__(self, ops: list[_Op], info: GraphInfo) -> None:
        self._ops = ops  # NOTE: views are not re-run (see the module docstring)
        self.info = info

    def replay(self) -> None:
        """Re-run the recorded ops on the same tensors, in order, and count the replay."""
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

    def frozen_gc(self) -> AbstractContextManager[None]:
        """Collect once, then freeze the heap while capturing (as the CUDA engine does)."""
        return frozen_gc()

    def capture(self, key: Hashable, fn: Callable[[], Any], warmup: int) -> tuple[EmulatedGraph, Any]:
        """Run ``fn`` ``warmup`` times, then once more recording every op it dispatches."""
        warm = time.perf_counter()
        for _ in range(warmup):
            fn()
        start = time.perf_counter()
        recorder = _Recorder()
        with torch.no_grad(), _HostReads(), recorder:
            out = fn()
        ops = recorder.ops
        calls = [
            (str(op.func.overloadpacket.__name__), requests_pdl(op.func, op.args, op.kwargs)) for op in ops
        ]
        topology = ops_topology(calls)
        counts = Counter(name for name, _ in calls)
        kernels = with_pdl([KernelCount(name, n) for name, n in counts.items()], topology)
        replayed, nbytes = recorder.finish()
        info = GraphInfo(key, time.perf_counter() - start, nbytes, len(ops), kernels, topology=topology)
        info.warmup_seconds = start - warm  # NOTE: nothing to instantiate: the op list is the graph
        out = tree_map(lambda x: x, out)
        return EmulatedGraph(replayed, info), out
