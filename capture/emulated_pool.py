"""The emulated engine's private pool: intermediates whose lives do not overlap share memory.

A CUDA graph's private pool reuses a block freed during capture for a later allocation of the
same capture, so a graph holds about its peak of live intermediates. The emulated engine keeps
every op's output alive (a replay copies into it), which without this would hold the *sum* of
them: a SmolLM2 step at 16 rows, 64 tokens, kept 4.6 GB, most of it each layer's gathered K/V.

:func:`share_storage` gives each intermediate storage (made by a recorded op) a slot in one
arena per device, by its live range in the op list (from the op that makes it to the last op
that reads or writes it; slots are reused first-fit), and points every tensor of it at its slot.
A storage still reachable once capture ends (the graph's output, a workspace some object keeps,
a view the recorded ops never saw) keeps its own memory: it is *escaped*.
"""

from __future__ import annotations

import bisect
import heapq
import sys
from collections.abc import Iterator, Sequence
from typing import Any

import torch

#: Slot offsets are multiples of this many bytes (every dtype's alignment).
ALIGN = 64


def _tensors(value: Any, seen: set[int]) -> Iterator[torch.Tensor]:
    """Every tensor in ``value`` (tuples, lists, dict values), once per reference a container
    not in ``seen`` holds (a container shared by two records counts once)."""
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (tuple, list, dict)) and id(value) not in seen:
        seen.add(id(value))
        for v in value.values() if isinstance(value, dict) else value:
            yield from _tensors(v, seen)


def _key(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


class _Storage:
    """One intermediate storage: its tensors, size, device and live range in the op list."""

    def __init__(self, t: torch.Tensor, made: int) -> None:
        self.tensors: dict[int, torch.Tensor] = {}
        self.nbytes = t.untyped_storage().nbytes()
        self.device = t.device
        self.made = self.last = made

    def escaped(self, held: dict[int, int], returned: set[int], bases: set[int]) -> bool:
        """Whether anything beyond the op records holds one of its tensors, or a tensor on it.

        ``held``: references the records hold, by tensor id; ``bases``: ids of the tensors that
        a recorded view is a view of (a tensor referenced from C++ holds one more reference
        to its Python object, however many views there are)."""
        if any(id(t) in returned for t in self.tensors.values()):
            return True
        for tid in self.tensors:
            # NOTE: the dict's value and getrefcount's argument are the two references over held
            # (no loop variable: an items() iterator keeps its last pair alive)
            if sys.getrefcount(self.tensors[tid]) - 2 > held[tid] + (tid in bases):
                return True
        first = next(iter(self.tensors.values()))
        storage = first.untyped_storage()
        # NOTE: each tensor on the storage holds one use, and so does ``storage`` itself
        return torch._C._storage_Use_Count(storage._cdata) > len(self.tensors) + 1


def share_storage(ops: Sequence[Any], out: Any) -> int:
    """Point the intermediates of ``ops`` (``_Op`` records; ``out``: what the capture returned)
    at shared slots; returns the bytes the graph now keeps (arenas plus escaped storages)."""
    storages: dict[int, _Storage] = {}
    held: dict[int, int] = {}
    seen: set[int] = set()
    for i, op in enumerate(ops):
        for t in op.outs:
            if t.untyped_storage().nbytes() and _key(t) not in storages:
                storages[_key(t)] = _Storage(t, i)
        for t in (*_tensors(op.args, seen), *_tensors(op.kwargs, seen), *_tensors(op.outs, seen)):
            held[id(t)] = held.get(id(t), 0) + 1
            found = storages.get(_key(t))
            if found is not None:
                found.tensors[id(t)] = t
                found.last = i
    returned = {id(t) for t in _tensors(out, set())}
    bases = {id(t._base) for s in storages.values() for t in s.tensors.values() if t._base is not None}
    escaped = {key: s.escaped(held, returned, bases) for key, s in storages.items()}
    kept = sum(s.nbytes for key, s in storages.items() if escaped[key])
    return kept + _place([s for key, s in storages.items() if not escaped[key]])


def _place(storages: list[_Storage]) -> int:
    """Best-fit slots by live range, one arena per device; returns the arenas' bytes."""
    by_device: dict[torch.device, list[_Storage]] = {}
    for s in sorted(storages, key=lambda s: s.made):
        by_device.setdefault(s.device, []).append(s)
    total = 0
    for device, group in by_device.items():
        busy: list[tuple[int, int, int]] = []  # heap of (last use, offset, size)
        free: list[tuple[int, int]] = []  # sorted (size, offset)
        offsets, end = [], 0
        for s in group:
            while busy and busy[0][0] < s.made:
                _, offset, size = heapq.heappop(busy)
                bisect.insort(free, (size, offset))
            size = -(-s.nbytes // ALIGN) * ALIGN
            j = bisect.bisect_left(free, (size, -1))
            if j < len(free):
                size, offset = free.pop(j)
            else:
                offset, end = end, end + size
            heapq.heappush(busy, (s.last, offset, size))
            offsets.append(offset)
        arena = torch.UntypedStorage(end, device=device)
        for s, offset in zip(group, offsets, strict=True):
            for t in s.tensors.values():
                t.set_(arena, offset // t.element_size() + t.storage_offset(), t.size(), t.stride())
        total += end
    return total
