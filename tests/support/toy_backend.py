"""A toy attention backend in one file, as ``docs/recipes.md`` writes it: its own host-written
buffer, an in-graph plan, and what it serves declared (opt-in: no token trees, no ``qv``, no
cross-attention). ``tests/attention/test_backend_hooks.py`` adds it with one registry line and
``tests/attention/test_conformance.py`` holds it to the reference.

Attention is the torch reference's; around it the backend keeps ``row_len`` (each request
row's KV length, written on the host every step), ``seen`` (the plan's copy of it, made on the
device) and ``plans`` (how many forwards were planned: one per step, not one per layer).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from graphrt.attention import AttendCall, BufferGroup, GraphSupport
from graphrt.attention.reference import ReferenceBackend
from graphrt.buffers import BufferSpec, PadRule
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
    graph_support = GraphSupport(
        frozenset(
            {
                ForwardMode.DECODE,
                ForwardMode.TARGET_VERIFY,
                ForwardMode.DRAFT_EXTEND,
                ForwardMode.DRAFT_DECODE,
            }
        ),
        window=True,
        sinks=True,
        fp8_kv=True,
        chunked_local=True,
    )
    #: Python-side plan calls (eager steps run the plan's Python; replays do not).
    host_plans = 0

    def buffers(self) -> BufferGroup:
        return BufferGroup(TOY_SPECS, ToyBuffers, self.write_host)

    def write_host(self, batch: Batch, host: dict[str, np.ndarray], rows: int) -> None:
        host["row_len"][: batch.bs] = batch.seq_lens
        host["row_len"][batch.bs : rows] = 0

    def plan(self, call: AttendCall) -> Any:
        type(self).host_plans += 1
        group = call.group
        group.seen.copy_(group.row_len)
        group.plans.add_(1)
        return group.seen


class CausalTreeToy(ToyBackend):
    """A deliberately wrong toy: it declares token trees but attends a tree's tokens causally,
    as if they were a chain (it ignores ``meta.cascade``). The conformance suite must fail it."""

    name = "toy-causal-tree"
    graph_support = dataclasses.replace(ToyBackend.graph_support, trees=True)

    def forward(self, call: AttendCall) -> torch.Tensor:
        return super().forward(dataclasses.replace(call, meta=dataclasses.replace(call.meta, cascade=None)))
