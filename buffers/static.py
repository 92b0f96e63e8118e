"""One arena per buffer group: every static tensor is a typed slice of it."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

import numpy as np
import torch

from graphrt.buffers.poison import fill_host_poison, fill_poison, host_mirror, poisoned_mask
from graphrt.buffers.spec import BufferSpec, Dims
from graphrt.buffers.stream import current_stream

T = TypeVar("T")

#: Every buffer starts on this byte boundary (kernels use vector loads on metadata rows).
ALIGN = 256
#: Pinned host mirrors per group on CUDA: step N+1 is written while step N's copy runs.
MIRRORS = 2


@dataclass(frozen=True, slots=True)
class MemoryRow:
    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    nbytes: int
    host: bool


@dataclass(frozen=True, slots=True)
class MemoryReport:
    """Bytes per declared buffer; ``total_bytes`` is exactly the declared sum."""

    group: str
    rows: tuple[MemoryRow, ...]
    arena_bytes: int
    host_arena_bytes: int

    @property
    def total_bytes(self) -> int:
        return sum(r.nbytes for r in self.rows)

    @property
    def padding_bytes(self) -> int:
        """Alignment gaps inside the arena (never counted as buffer bytes)."""
        return self.arena_bytes - self.total_bytes


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


class StaticBuffers(Generic[T]):
    """Allocates a group of :class:`BufferSpec` once, at the maximum dims.

    Host-written buffers are laid out first so that one copy moves all of them from the
    pinned host mirror to the device. Bucket views are cached, so the tensors a graph
    captured are the very objects (and addresses) every later update writes.

    Parameters
    ----------
    group : str
        Name used in reports.
    specs : sequence of BufferSpec
    view_type : type
        A dataclass whose fields are exactly the spec names; views are built as instances.
    dims : Dims
        Maximum dims for the allocation.
    device : torch.device
    ring : int, optional
        Pinned host mirrors on CUDA (default :data:`MIRRORS`); always one on the CPU.
    """

    def __init__(
        self,
        group: str,
        specs: Sequence[BufferSpec],
        view_type: type[T],
        dims: Dims,
        device: torch.device,
        ring: int | None = None,
    ) -> None:
        fields = {f.name for f in dataclasses.fields(view_type)}  # type: ignore[arg-type]
        names = [s.name for s in specs]
        if fields != set(names) or len(names) != len(set(names)):
            raise TypeError(f"{view_type.__name__} fields {sorted(fields)} != specs {names}")
        self.group, self.dims, self.device, self.view_type = group, dims, device, view_type
        self.specs = tuple(sorted(specs, key=lambda s: not s.host))  # host-written first
        offsets, end, host_end = {}, 0, 0
        for spec in self.specs:
            offsets[spec.name] = end
            end = _align(end + spec.nbytes(dims))
            host_end = end if spec.host else host_end
        self.arena = torch.zeros(end, dtype=torch.uint8, device=device)
        # NOTE: the upload's destination, sliced once (a tensor slice is costly per step).
        self._upload_dst = self.arena[:host_end]
        pin = device.type == "cuda"
        # NOTE: a ring of pinned mirrors on CUDA: the host fills mirror k+1 while mirror k's
        # copy is still in flight; on the CPU the copy is synchronous, so one mirror does.
        depth = (ring or MIRRORS) if pin else 1
        self.host_arenas = [torch.zeros(host_end, dtype=torch.uint8, pin_memory=pin) for _ in range(depth)]
        self.full = {s.name: self._typed(self.arena, offsets[s.name], s) for s in self.specs}
        self.mirrors = [
            {s.name: host_mirror(self._typed(arena, offsets[s.name], s)) for s in self.specs if s.host}
            for arena in self.host_arenas
        ]
        self._events = [torch.cuda.Event() if pin else None for _ in range(depth)]
        # NOTE: the arena's device carries its index (``cuda`` alone does not): the upload's
        # stream lookup then skips ``torch.cuda.current_device()`` every step; and the copy
        # runs on the arena's device's stream, which is where the event must be recorded.
        self._stream_device = self.arena.device
        self._pending = [False] * depth
        self.slot = 0
        self._views: dict[tuple[int, int], T] = {}

    @property
    def host_arena(self) -> torch.Tensor:
        """The current pinned host mirror (the one the next :meth:`upload` copies)."""
        return self.host_arenas[self.slot]

    @property
    def host_full(self) -> dict[str, np.ndarray]:
        """The current mirror's buffers by name (numpy views of :attr:`host_arena`)."""
        return self.mirrors[self.slot]

    def _typed(self, arena: torch.Tensor, offset: int, spec: BufferSpec) -> torch.Tensor:
        nbytes = spec.nbytes(self.dims)
        return arena[offset : offset + nbytes].view(spec.dtype).view(spec.size(self.dims))

    def view(self, bucket: int, rows_per_req: int = 1, tokens: int | None = None) -> T:
        """Typed views for one bucket: each buffer sliced along dim 0. Cached per bucket.

        ``tokens``: the token rows, when not ``bucket * rows_per_req`` (a token-bucketed graph
        of ``bucket`` request rows)."""
        if tokens == bucket * rows_per_req:
            tokens = None  # NOTE: one cached view per shape, however it is named
        key = (bucket, rows_per_req if tokens is None else -tokens)
        if key not in self._views:
            dims = self.dims.for_bucket(bucket, rows_per_req, tokens)
            if not 1 <= bucket <= self.dims.max_bs or dims.max_tokens > self.dims.max_tokens:
                # NOTE: slicing past the allocation would silently give a short view.
                raise ValueError(
                    f"bucket {bucket} x {rows_per_req} tokens exceeds the allocation {self.dims}"
                )
            views = {s.name: self.full[s.name][: s.size(dims)[0]] for s in self.specs}
            self._views[key] = self.view_type(**views)
        return self._views[key]

    def host(self, name: str) -> np.ndarray:
        """The pinned host mirror of a host-written buffer, full size (numpy, writable).

        A bf16 buffer's mirror holds raw bits (``uint16``; write ``buffers.poison.to_bits``)."""
        return self.host_full[name]

    def next_mirror(self) -> dict[str, np.ndarray]:
        """Make the next mirror of the ring current and return it, free to write.

        Waits only for that mirror's own last copy (``ring`` steps ago), never for the copy
        of the step just uploaded.
        """
        self.slot = (self.slot + 1) % len(self.mirrors)
        self._wait(self.slot)
        return self.mirrors[self.slot]

    def _wait(self, slot: int) -> None:
        event = self._events[slot]
        if event is not None and self._pending[slot]:
            event.synchronize()
            self._pending[slot] = False

    def wait_host_free(self) -> None:
        """Block until every host→device copy has read its mirror."""
        for slot in range(len(self.mirrors)):
            self._wait(slot)

    def upload(self) -> None:
        """One asynchronous copy of the current mirror's host-written buffers to the device."""
        self._upload_dst.copy_(self.host_arenas[self.slot], non_blocking=True)
        event = self._events[self.slot]
        if event is not None:
            event.record(current_stream(self._stream_device))
            self._pending[self.slot] = True

    def poison(self) -> None:
        """Fill every buffer (device and host mirror) with its dtype's poison (``buffers.poison``)."""
        self.wait_host_free()
        for tensor in self.full.values():
            fill_poison(tensor)
        dtypes = {s.name: s.dtype for s in self.specs}
        for mirror in self.mirrors:
            for name, arr in mirror.items():
                fill_host_poison(arr, dtypes[name])

    def poisoned(self, bucket: int, rows_per_req: int = 1, tokens: int | None = None) -> list[str]:
        """Names of buffers whose bucket view still holds poison (debug mode; syncs)."""
        view = self.view(bucket, rows_per_req, tokens)
        found = []
        for spec in (s for s in self.specs if not s.scratch):
            tensor = getattr(view, spec.name)
            if bool(poisoned_mask(tensor.flatten()[:1] if spec.head_only else tensor).any()):
                found.append(spec.name)
        return found

    def pad_violations(
        self, bucket: int, rows_per_req: int, bs: int, pad_values: Mapping[str, int]
    ) -> list[str]:
        """Names of buffers whose padded rows break their :class:`PadRule` (syncs)."""
        view = self.view(bucket, rows_per_req)
        rows = {"max_bs": bs, "max_tokens": bs * rows_per_req}
        bad = []
        for spec in self.specs:
            first = spec.shape[0]
            start = rows.get(first.partition("+")[0], 0) if isinstance(first, str) else 0
            if not _pad_ok(getattr(view, spec.name), spec, start, pad_values):
                bad.append(spec.name)
        return bad

    def memory_report(self) -> MemoryReport:
        rows = tuple(
            MemoryRow(s.name, s.size(self.dims), s.dtype, s.nbytes(self.dims), s.host) for s in self.specs
        )
        return MemoryReport(self.group, rows, self.arena.numel(), self.host_arena.numel())


def _pad_ok(t: torch.Tensor, spec: BufferSpec, start: int, pad_values: Mapping[str, int]) -> bool:
    rule = spec.pad
    if rule.kind == "free":
        return True
    value = pad_values[rule.value] if isinstance(rule.value, str) else rule.value
    if rule.kind == "const":
        return bool((t[start:] == value).all())
    tail = t[max(start, 0) :].long()
    return bool((tail.diff() == value).all())
