"""The emulated engine's private pool: intermediates whose lives do not overlap share memory.

A CUDA graph's private pool reuses a block freed during capture for a later allocation of the
same capture, so capturing and keeping a graph cost about its peak of live intermediates. The
emulated engine replays recorded ops on recorded tensors; holding every op's tensors as it
records would hold the *sum* of a step's intermediates (a SmolLM2 step at 16 rows and 64 tokens:
4.6 GB, most of it each layer's gathered K/V), during the capture and for the graph's life.

So :class:`Pool` keeps no intermediate while recording. Each storage an op makes is an
*intermediate* with an id; a recorded op holds a :class:`_Ref` (the id and the view: dtype,
size, stride, offset) wherever it reads or writes one, and the program frees each as it would
eagerly. :meth:`Pool.finish` then gives every intermediate that died a slot in one arena per
device, by its live range in the op list (best fit among the slots free again), and puts
tensors on those slots into the records. An intermediate still alive when recording ends (the
graph's output, a workspace some object keeps, a view held anywhere) is *escaped*: it keeps its
own storage, which the records then view.
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch.multiprocessing.reductions import StorageWeakRef

#: Slot offsets are multiples of this many bytes (every dtype's alignment).
ALIGN = 64


@dataclass(frozen=True, slots=True)
class _Ref:
    """A recorded tensor on intermediate ``sid``: its dtype and view of the storage."""

    sid: int
    dtype: torch.dtype
    size: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int


@dataclass(slots=True)
class _Made:
    """One intermediate: its storage (weakly), device, bytes and live range in the op list."""

    storage: StorageWeakRef
    device: torch.device
    nbytes: int
    made: int
    last: int


class Pool:
    """The intermediates of one recording (see the module docstring)."""

    def __init__(self) -> None:
        self._made: list[_Made] = []
        #: Storage address -> the intermediate there (stale once its storage died).
        self._at: dict[int, int] = {}

    def _sid(self, storage: torch.UntypedStorage) -> int | None:
        sid = self._at.get(storage.data_ptr())
        return None if sid is None or self._made[sid].storage.expired() else sid

    def made(self, outs: tuple[torch.Tensor, ...], i: int) -> tuple[Any, ...]:
        """Op ``i``'s fresh outputs registered as intermediates; their records."""
        for t in outs:
            st = t.untyped_storage()
            if st.nbytes() and self._sid(st) is None:
                self._at[st.data_ptr()] = len(self._made)
                self._made.append(_Made(StorageWeakRef(st), t.device, st.nbytes(), i, i))
        return tuple(self.record(t, i) for t in outs)

    def record(self, value: Any, i: int) -> Any:
        """``value`` (an op's argument) as op ``i`` records it: each intermediate tensor a
        :class:`_Ref`, counted as used at ``i``; anything else itself."""
        return _map(lambda v: self._ref(v, i) if isinstance(v, torch.Tensor) else v, value)

    def _ref(self, t: torch.Tensor, i: int) -> torch.Tensor | _Ref:
        storage = t.untyped_storage()
        sid = self._sid(storage) if storage.nbytes() else None
        if sid is None:
            return t
        self._made[sid].last = i
        return _Ref(sid, t.dtype, tuple(t.size()), tuple(t.stride()), t.storage_offset())

    def finish(self) -> tuple[Any, int]:
        """``(tensor_of, bytes)``: a function from a record to the tensor to replay on, and the
        bytes the graph keeps (the arenas and the escaped storages)."""
        storages: dict[int, tuple[torch.UntypedStorage, int]] = {}
        kept = 0
        for sid, m in enumerate(self._made):
            if not m.storage.expired():
                storages[sid] = (torch.UntypedStorage._new_with_weak_ptr(m.storage.cdata), 0)
                kept += m.nbytes
        shared = [sid for sid in range(len(self._made)) if sid not in storages]
        arenas = _place([self._made[sid] for sid in shared])
        for sid, placed in zip(shared, arenas.slots, strict=True):
            storages[sid] = placed
        cache: dict[_Ref, torch.Tensor] = {}

        def tensor(ref: _Ref) -> torch.Tensor:
            if ref not in cache:
                storage, at = storages[ref.sid]
                t = torch.empty(0, dtype=ref.dtype, device=self._made[ref.sid].device)
                cache[ref] = t.set_(storage, at // t.element_size() + ref.offset, ref.size, ref.stride)
            return cache[ref]

        def tensor_of(value: Any) -> Any:
            return _map(lambda v: tensor(v) if isinstance(v, _Ref) else v, value)

        return tensor_of, kept + arenas.nbytes


def _map(fn: Callable[[Any], Any], value: Any) -> Any:
    """``fn`` of every leaf in ``value``'s tuples, lists and dict values (rebuilt as such)."""
    if isinstance(value, (tuple, list)):
        return type(value)(_map(fn, v) for v in value)
    if isinstance(value, dict):
        return {k: _map(fn, v) for k, v in value.items()}
    return fn(value)


@dataclass(frozen=True, slots=True)
class _Arenas:
    slots: list[tuple[torch.UntypedStorage, int]]  # per intermediate: its arena and byte offset
    nbytes: int


def _place(made: list[_Made]) -> _Arenas:
    """Best-fit slots by live range (a slot is free again after its last user's op), one arena
    per device."""
    ends: dict[torch.device, int] = {}
    busy: dict[torch.device, list[tuple[int, int, int]]] = {}  # heap of (last use, offset, size)
    free: dict[torch.device, list[tuple[int, int]]] = {}  # sorted (size, offset)
    offsets: list[int] = [0] * len(made)
    for k in sorted(range(len(made)), key=lambda k: made[k].made):
        m = made[k]
        heap, idle = busy.setdefault(m.device, []), free.setdefault(m.device, [])
        while heap and heap[0][0] < m.made:
            _, offset, size = heapq.heappop(heap)
            bisect.insort(idle, (size, offset))
        size = -(-m.nbytes // ALIGN) * ALIGN
        j = bisect.bisect_left(idle, (size, -1))
        if j < len(idle):
            size, offset = idle.pop(j)
        else:
            offset = ends.get(m.device, 0)
            ends[m.device] = offset + size
        heapq.heappush(heap, (m.last, offset, size))
        offsets[k] = offset
    arenas = {device: torch.UntypedStorage(end, device=device) for device, end in ends.items()}
    slots = [(arenas[m.device], offsets[k]) for k, m in enumerate(made)]
    return _Arenas(slots, sum(ends.values()))
