"""Buffer groups as rows of a table, like the forward modes' ``MODES``.

A group is a set of static buffers allocated together (one arena, one host mirror ring, one
upload). Each group's module exports one :class:`GroupRow`: its specs from the runtime's
:class:`Geometry`, whether it exists for that geometry, which modes use it, and its host
writer (None for groups derived on the device only). :class:`~graphrt.metadata.buffer_groups.BufferGroups`
loops over the table; nothing names a group by hand elsewhere.

A writer owns its own state (what a mirror's pad region holds, which page-table columns may
hold real pages, whether sampling rows are greedy): ``forget()`` drops it when the device
buffers are poisoned or written by a capture.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch

from graphrt.buffers import BufferSpec, Dims, StaticBuffers
from graphrt.step.batch import Batch
from graphrt.step.modes import ForwardMode, SpecGeometry

#: A host write of an attention backend's own group: ``write(batch, host, rows)``.
HostWrite = Callable[[Batch, dict[str, np.ndarray], int], None]


@dataclass(frozen=True, slots=True)
class BufferGroup:
    """An attention backend's own buffers: ``specs`` and ``view_type`` (a dataclass with a
    field per spec); ``write`` is its host half when any spec is host-written."""

    specs: tuple[BufferSpec, ...]
    view_type: type
    write: HostWrite | None = None

    def __post_init__(self) -> None:
        if any(s.host for s in self.specs) and self.write is None:
            raise ValueError(f"{self.view_type.__name__} has host-written buffers but no write")


class LocalShape(Protocol):
    """What the local group needs of :class:`~graphrt.metadata.local.LocalGeometry`."""

    chunk_size: int
    page_size: int

    def chunk_pages(self, max_pages: int) -> int: ...


class WindowShape(Protocol):
    """What the window group needs of :class:`~graphrt.kv.window.WindowPool`."""

    window: int
    page_size: int
    dummy_slot: int
    dummy_page: int

    def slots(self, batch: Batch) -> np.ndarray:
        """The window slot of each ``batch.out_cache_loc`` entry (assigned by the runtime)."""
        ...


@dataclass(frozen=True, slots=True)
class Geometry:
    """What decides which groups exist and how large they are; fixed for a runtime.

    ``spec``: speculative geometry; ``local``: chunked-local attention; ``sample``: in-graph
    sampling; ``attention``: the attention backend's own group, if it has one; ``encoder``:
    an encoder-decoder model's encoder page table and lengths; ``window``: the window-layer KV
    pool, if window layers keep their own pages; ``routing``: a MoE model's experts and top-k.
    """

    spec: SpecGeometry | None = None
    local: LocalShape | None = None
    sample: bool = False
    page_size: int = 1
    attention: BufferGroup | None = None
    encoder: EncoderGeometry | None = None
    window: WindowShape | None = None
    routing: RoutingGeometry | None = None

    @property
    def tree(self) -> bool:
        """Token trees (``topk > 1``): the cascade group exists."""
        return self.spec is not None and self.spec.topk > 1


class RoutingGeometry(Protocol):
    """What the routing group needs of :class:`~graphrt.metadata.routing.RoutingShape`."""

    num_experts: int
    topk: int


class EncoderGeometry(Protocol):
    """What the encoder group needs of :class:`~graphrt.metadata.encoder.EncoderShape`."""

    max_pages: int


class Writer(Protocol):
    """The host half of one group's update."""

    def write(self, group: StaticBuffers, batch: Batch, rows: int, tokens: int, pad: dict[str, int]) -> bool:
        """Write ``batch`` padded to ``rows`` requests / ``tokens`` token rows into the next
        mirror of ``group``; False when the device already holds it (no upload needed)."""
        ...

    def forget(self) -> None:
        """The device buffers no longer hold what this writer last wrote."""
        ...


@dataclass(frozen=True, slots=True)
class GroupRow:
    """One buffer group: ``specs`` (from the geometry and the allocation's dims) and
    ``view_type``, whether it ``exists``, whether ``used_by`` a mode, and its ``writer``
    (None, or a factory returning None: derived on the device only)."""

    name: str
    specs: Callable[[Geometry, Dims], Sequence[BufferSpec]]
    view_type: Callable[[Geometry], type]
    exists: Callable[[Geometry], bool]
    used_by: Callable[[ForwardMode, Geometry], bool]
    writer: Callable[[Geometry, Dims, torch.device], Writer | None] | None = None


class Stateless:
    """A writer that rewrites every row each step: ``fn(batch, host, tokens, dummy_slot)``."""

    def __init__(self, fn: Callable[[Batch, dict[str, np.ndarray], int, int], None]) -> None:
        self.fn = fn

    def write(self, group: StaticBuffers, batch: Batch, rows: int, tokens: int, pad: dict[str, int]) -> bool:
        self.fn(batch, group.next_mirror(), tokens, pad["dummy_slot"])
        return True

    def forget(self) -> None:
        return None


class BackendWriter:
    """An attention backend's host write (its group's host-written buffers)."""

    def __init__(self, write: HostWrite) -> None:
        self.fn = write

    def write(self, group: StaticBuffers, batch: Batch, rows: int, tokens: int, pad: dict[str, int]) -> bool:
        self.fn(batch, group.next_mirror(), rows)
        return True

    def forget(self) -> None:
        return None


def _attention_specs(geometry: Geometry, dims: Dims) -> Sequence[BufferSpec]:
    return geometry.attention.specs if geometry.attention is not None else ()


def _attention_type(geometry: Geometry) -> Any:
    return geometry.attention.view_type if geometry.attention is not None else None


def _attention_writer(geometry: Geometry, dims: Dims, device: torch.device) -> Writer | None:
    write = geometry.attention.write if geometry.attention is not None else None
    return BackendWriter(write) if write is not None else None


#: The attention backend's own group (e.g. FA3's scheduler metadata, sparse MLA's top-k).
ATTENTION_GROUP = GroupRow(
    "attention",
    _attention_specs,
    _attention_type,
    exists=lambda g: g.attention is not None,
    used_by=lambda mode, g: True,
    writer=_attention_writer,
)
