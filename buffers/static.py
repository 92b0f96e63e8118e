"""One arena per buffer family: every static tensor is a typed slice of it."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

import numpy as np
import torch

from graphrt.buffers.poison import fill_host_poison, fill_poison, host_mirror, poisoned_mask
from graphrt.buffers.spec import BufferSpec, Dims

T = TypeVar("T")

#: Every buffer starts on this byte boundary (kernels use vector loads on metadata rows).
ALIGN = 256


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

    family: str
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
    """Allocates a family of :class:`BufferSpec` once, at the maximum dims.

    Host-written buffers are laid out first so that one copy moves all of them from the
    pinned host mirror to the device. Bucket views are cached, so the tensors a graph
    captured are the very objects (and addresses) every later update writes.

    Parameters
    ----------
    family : str
        Name used in reports.
    specs : sequence of BufferSpec
    view_type : type
        A dataclass whose fields are exactly the spec names; views are built as instances.
    dims : Dims
        Maximum dims for the allocation.
    device : torch.device
    """

    def __init__(
        self,
        family: str,
        specs: Sequence[BufferSpec],
        view_type: type[T],
        dims: Dims,
        device: torch.device,
    ) -> None:
        fields = {f.name for f in dataclasses.fields(view_type)}  # type: ignore[arg-type]
        names = [s.name for s in specs]
        if fields != set(names) or len(names) != len(set(names)):
            raise TypeError(f"{view_type.__name__} fields {sorted(fields)} != specs {names}")
        self.family, self.dims, self.device, self.view_type = family, dims, device, view_type
        self.specs = tuple(sorted(specs, key=lambda s: not s.host))  # host-written first
        offsets, end, host_end = {}, 0, 0
        for spec in self.specs:
            offsets[spec.name] = end
            end = _align(end + spec.nbytes(dims))
            host_end = end if spec.host else host_end
        self.arena = torch.zeros(end, dtype=torch.uint8, device=device)
        pin = device.type == "cuda"
        self.host_arena = torch.zeros(host_end, dtype=torch.uint8, pin_memory=pin)
        self.full = {s.name: self._typed(self.arena, offsets[s.name], s) for s in self.specs}
        self.host_full = {
            s.name: host_mirror(self._typed(self.host_arena, offsets[s.name], s))
            for s in self.specs
            if s.host
        }
        self._copy_done = torch.cuda.Event() if pin else None
        self._views: dict[tuple[int, int], T] = {}

    def _typed(self, arena: torch.Tensor, offset: int, spec: BufferSpec) -> torch.Tensor:
        nbytes = spec.nbytes(self.dims)
        return arena[offset : offset + nbytes].view(spec.dtype).view(spec.size(self.dims))

    def view(self, bucket: int, rows_per_req: int = 1) -> T:
        """Typed views for one bucket: each buffer sliced along dim 0. Cached per bucket."""
        key = (bucket, rows_per_req)
        if key not in self._views:
            dims = self.dims.for_bucket(bucket, rows_per_req)
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

    def wait_host_free(self) -> None:
        """Block until the last host→device copy has read the host mirror."""
        if self._copy_done is not None:
            self._copy_done.synchronize()

    def upload(self) -> None:
        """One asynchronous copy of every host-written buffer to the device."""
        n = self.host_arena.numel()
        self.arena[:n].copy_(self.host_arena, non_blocking=True)
        if self._copy_done is not None:
            self._copy_done.record()

    def poison(self) -> None:
        """Fill every buffer (device and host mirror) with its dtype's poison (``buffers.poison``)."""
        self.wait_host_free()
        for tensor in self.full.values():
            fill_poison(tensor)
        dtypes = {s.name: s.dtype for s in self.specs}
        for name, arr in self.host_full.items():
            fill_host_poison(arr, dtypes[name])

    def poisoned(self, bucket: int, rows_per_req: int = 1) -> list[str]:
        """Names of buffers whose bucket view still holds poison (debug mode; syncs)."""
        view = self.view(bucket, rows_per_req)
        found = []
        for spec in self.specs:
            if bool(poisoned_mask(getattr(view, spec.name)).any()):
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
        return MemoryReport(self.family, rows, self.arena.numel(), self.host_arena.numel())


def _pad_ok(t: torch.Tensor, spec: BufferSpec, start: int, pad_values: Mapping[str, int]) -> bool:
    rule = spec.pad
    if rule.kind == "free":
        return True
    value = pad_values[rule.value] if isinstance(rule.value, str) else rule.value
    if rule.kind == "const":
        return bool((t[start:] == value).all())
    tail = t[max(start, 0) :].long()
    return bool((tail.diff() == value).all())
