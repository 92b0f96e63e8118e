"""A backend row made of rows: each step goes to the first part that takes it.

A dispatch of parts ``(p_1, …, p_n)`` serves what its last part ``p_n`` (the base) serves: the
base takes every step, owns the buffer group and the plan, and says which steps it
``yields`` (FA3: single-token decode steps whose CTAs would leave the GPU short); such a step
goes to the first earlier part that ``takes`` it (the split decode kernel: one query token per
request, no options, tensors it fits). Parts before the base have no buffers nor plan of their
own, so a step they take reads the same static buffers whichever part runs it.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from graphrt.attention.base import Backend
from graphrt.attention.call import AttendCall
from graphrt.attention.capabilities import GraphSupport
from graphrt.metadata.groups import BufferGroup
from graphrt.step.batch import Batch


class Dispatch(Backend):
    """Parts ``parts`` (built backends), the base last; named ``name``."""

    def __init__(self, name: str, parts: tuple[Any, ...]) -> None:
        if not parts:
            raise ValueError(f"dispatch {name!r} needs at least one part")
        for part in parts[:-1]:
            if part.buffers() is not None:
                raise ValueError(
                    f"dispatch {name!r}: part {part.name!r} has a buffer group; only the last "
                    f"part ({parts[-1].name!r}) may own one"
                )
        self.name, self.parts, self.base = name, parts, parts[-1]
        #: The base's: it takes every step the other parts decline.
        self.graph_support: GraphSupport = self.base.graph_support

    def buffers(self) -> BufferGroup | None:
        return self.base.buffers()

    def write_host(self, batch: Batch, host: dict[str, np.ndarray], rows: int) -> None:
        self.base.write_host(batch, host, rows)

    def plan(self, call: AttendCall) -> Any:
        return self.base.plan(call)

    def part_for(self, call: AttendCall) -> Any:
        """The part that takes ``call``: the first earlier part that takes a step the base
        yields, else the base."""
        if self.base.yields(call):
            for part in self.parts[:-1]:
                if part.takes(call):
                    return part
        return self.base

    def fuses_store(self, call: AttendCall) -> bool:
        """Whether the part that takes ``call`` fuses the store (FA3's row: split decode's steps)."""
        return self.part_for(call).fuses_store(call)

    def forward(self, call: AttendCall) -> torch.Tensor:
        return self.part_for(call).forward(call)

    def cross(self, call: AttendCall, encoder: Any) -> torch.Tensor:
        return self.base.cross(call, encoder)

    def host_scalars(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for part in self.parts:
            out.update(part.host_scalars())
        return out
