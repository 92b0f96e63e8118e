"""FA3's per-step plan: the buffer its tile schedule lives in, and the split rule.

:class:`~graphrt.attention.fa3.FA3Backend` plans once per forward, inside the graph, with
``get_scheduler_metadata``; every layer's call passes the same ``num_splits``, a function of the
bucket (a graph key) and the device only, so a replay never re-plans differently.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from graphrt.buffers import BufferSpec, PadRule

#: FA3's schedule for ``b`` requests holds at most ``4 * round_up(b, 4) + 1`` int32 (split
#: counts, m-blocks, batch order, heads in L2, tile semaphore); ``4 * b + 16`` covers it.
SCHEDULER_SPECS = (
    BufferSpec("scheduler_metadata", ("4*max_bs+16",), torch.int32, PadRule("free"), head_only=True),
)


#: A bucket whose ``requests x KV heads`` tiles cover this share of the SMs runs unsplit: FA3's
#: own rule, which its planned (dynamic-split) path applies as if the batch held one request,
#: and so splits, and adds a combine kernel, even where the tiles already fill the GPU.
FULL_SHARE = 0.8


@functools.cache
def sm_count(device: torch.device) -> int:
    """The device's SM count (read once per device)."""
    return torch.cuda.get_device_properties(device).multi_processor_count


def planned_splits(batch: int, heads_k: int, sms: int) -> int:
    """FA3's ``num_splits`` for a planned step of ``batch`` requests (the bucket, a graph key) with
    ``heads_k`` KV heads on ``sms`` SMs: 1 (unsplit, no combine kernel) where the ``batch *
    heads_k`` tiles fill :data:`FULL_SHARE` of the SMs, else 0 (FA3's heuristic splits the keys)."""
    return 1 if batch * heads_k >= FULL_SHARE * sms else 0


def leaves_gpu_short(requests: int, heads_k: int, sms: int) -> bool:
    """Whether ``requests x heads_k`` CTAs (FA3's decode: one per request and KV head) cover
    less than :data:`FULL_SHARE` of ``sms`` SMs: the steps FA3 yields to the split decode."""
    return requests * heads_k < FULL_SHARE * sms


@dataclass(slots=True)
class FA3Buffers:
    """``scheduler_metadata [4 * bs + 16]`` int32: FA3's tile schedule of the step (its head)."""

    scheduler_metadata: torch.Tensor
