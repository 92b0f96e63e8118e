"""Scratch that a kernel leaves as it found it, shared per (device, stream): arrival counters.

A kernel whose last-arriving program finishes a group's work (the split decode attention's merge,
the fused sampler's decision) counts arrivals in int32 counters that must read 0 when a launch
starts, and the last program of each group sets its counter back to 0 (the sampler also zeroes
its row sums, so its whole workspace is kept this way). So a buffer is zeroed once, when
allocated, and then reused by every later launch on the same stream: two launches on one stream
never overlap, so graphs and eager steps can share it. It is allocated outside graph
capture (a runtime's warm-up runs on its capture stream, so the capture finds it) and kept for the
process. A capture that finds none allocates its own, not shared: its zeroing runs as a memset
node of the graph on every replay.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import torch

T = TypeVar("T")

_SHARED: dict[tuple, object] = {}


def shared(key: tuple, make: Callable[[], T], device: torch.device) -> T:
    """The scratch ``make()`` built for ``key`` on ``device``'s current stream (see the module
    docstring): made once per (device, stream, key) outside capture, privately inside one."""
    if device.type == "cuda" and device.index is None:  # NOTE: "cuda" and "cuda:0" share one
        device = torch.device("cuda", torch.cuda.current_device())
    capturing = device.type == "cuda" and torch.cuda.is_current_stream_capturing()
    stream = torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else 0
    full = (str(device), stream, *key)
    found = _SHARED.get(full)
    if found is None:
        found = make()
        if not capturing:  # NOTE: a capture's zeroing only happens on replay: never shared
            _SHARED[full] = found
    return found  # type: ignore[return-value]


def counters(n: int, device: torch.device) -> torch.Tensor:
    """At least ``n`` int32 arrival counters at 0 on ``device`` (a power of two >= 8 of them),
    shared as the module docstring says; every launch that uses them must leave them at 0."""
    capacity = max(8, 1 << (n - 1).bit_length())
    return shared(
        ("counters", capacity), lambda: torch.zeros(capacity, dtype=torch.int32, device=device), device
    )
