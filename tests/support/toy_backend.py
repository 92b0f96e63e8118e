"""A toy attention backend in one file: its own host-written buffer, an in-graph plan, and a
declared graph capability. ``tests/attention/test_backend_hooks.py`` adds it with one registry line.

Attention is the torch reference's; around it the backend keeps ``row_len`` (each request
row's KV length, written on the host every step), ``seen`` (the plan's copy of it, made on the
device) and ``plans`` (how many forwards were planned: one per step, not one per layer).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from graphrt.attention import BufferGroup, GraphSupport
from graphrt.attention.reference import ReferenceBackend
from graphrt.buffers import BufferSpec, PadRule
from graphrt.metadata.base import StepMetadata
from graphrt.step import Batch, ForwardMode

TOY_SPECS = (
    BufferSpec("row_len", ("max_bs",), torch.int64, PadRule("const", 0), host=True),
    BufferSpec("seen", ("max_bs",), torch.int64, PadRule("free")),
    BufferSpec("plans", (1,), torch.int64, PadRule("free")),
)


@dataclass(slots=True)
class ToyBuffers:
    row_len: torch.Tensor
    seen: torch.Tensor
    plans: torch.Tensor


class ToyBackend(ReferenceBackend):
    name = "toy"
    graph_support = GraphSupport(frozenset({ForwardMode.DECODE}))
    #: Python-side plan calls (eager steps run the plan's Python; replays do not).
    host_plans = 0

    def buffers(self) -> BufferGroup:
        return BufferGroup(TOY_SPECS, ToyBuffers, self.write_host)

    def write_host(self, batch: Batch, host: dict[str, np.ndarray], rows: int) -> None:
        host["row_len"][: batch.bs] = batch.seq_lens
        host["row_len"][batch.bs : rows] = 0

    def plan(self, meta: StepMetadata, group: ToyBuffers, q: torch.Tensor, k_cache: torch.Tensor) -> Any:
        type(self).host_plans += 1
        group.seen.copy_(group.row_len)
        group.plans.add_(1)
        return group.seen
