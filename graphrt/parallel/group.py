"""One rank's tensor-parallel group: set up from torchrun's environment, warmed up, torn down.

graphrt runs one TP group over the whole ``torch.distributed`` world. Every collective it
issues has the group's timeout; a failure raises :class:`CollectiveError` naming the rank.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import torch
import torch.distributed as dist

from graphrt.kernels import switches

T = TypeVar("T")
CPU = torch.device("cpu")


def default_timeout_s() -> float:
    """Seconds a collective may wait for the other ranks (the ``GRAPHRT_TP_TIMEOUT`` switch)."""
    return float(switches.active()["GRAPHRT_TP_TIMEOUT"])


class CollectiveError(RuntimeError):
    """A collective failed or timed out; the message names the rank that saw it."""


@dataclass(frozen=True, slots=True)
class TPGroup:
    """This rank's place in the tensor-parallel group (``size == 1``: no collectives at all).

    ``device_group`` carries the model's collectives (NCCL on CUDA, gloo on CPU),
    ``cpu_group`` (gloo) the host messages; ``name`` keys the communicator in :mod:`.ops`.
    """

    rank: int = 0
    size: int = 1
    device_group: Any = None
    cpu_group: Any = None
    device: torch.device = CPU
    timeout_s: float = field(default_factory=default_timeout_s)
    name: str = ""

    @property
    def is_driver(self) -> bool:
        """Rank 0 schedules; the other ranks run what it broadcasts."""
        return self.rank == 0

    def guard(self, what: str, fn: Callable[[], T]) -> T:
        """Run the collective ``fn``; re-raise a failure as :class:`CollectiveError` naming the rank."""
        try:
            return fn()
        except CollectiveError:
            raise
        except RuntimeError as err:
            raise CollectiveError(
                f"rank {self.rank} of {self.size}: {what} failed (collective timeout "
                f"{self.timeout_s:g} s; another rank took a different path or died): {err}"
            ) from err

    def barrier(self) -> None:
        if self.size > 1:
            self.guard("barrier", lambda: dist.barrier(group=self.cpu_group))

    def all_true(self, mine: bool, what: str) -> bool:
        """Whether ``mine`` holds on every rank (over the host group): a choice all ranks share."""
        if self.size == 1:
            return mine
        flag = torch.tensor([int(mine)], dtype=torch.int32)
        self.guard(what, lambda: dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=self.cpu_group))
        return bool(flag.item())
