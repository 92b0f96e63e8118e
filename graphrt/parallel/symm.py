"""One-shot all-reduce for small messages through torch symmetric memory (CUDA, one host).

One buffer per group, allocated with ``symm_mem.empty`` and rendezvoused once (a collective)
before any capture, so its address is what graphs bake in. A sum copies ``x`` into the
buffer and runs ``symm_mem.one_shot_all_reduce_out``: every rank reads every peer's buffer
over NVLink (P2P loads, no multicast: ``TORCH_SYMM_MEM_DISABLE_MULTICAST=1`` is fine) and
adds them in rank order, so every rank gets bit-identical results.
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from graphrt.parallel.group import TPGroup


class OneShot:
    """``all_reduce_(x)`` for ``x`` of at most ``max_bytes``; :meth:`fits` says which messages."""

    def __init__(self, group: TPGroup, buffer: torch.Tensor, handle: Any, max_bytes: int) -> None:
        self.group, self.buffer, self.handle, self.max_bytes = group, buffer, handle, max_bytes
        self.group_name = group.device_group.group_name

    @classmethod
    def create(cls, group: TPGroup, max_bytes: int, required: bool = False) -> OneShot | None:
        """The one-shot path, or ``None`` (with a warning) when symmetric memory is unusable here.

        Collective: every rank must call it, in the same order. ``required`` raises instead.
        """
        try:
            import torch.distributed._symmetric_memory as symm_mem

            if not hasattr(torch.ops.symm_mem, "one_shot_all_reduce_out"):
                raise RuntimeError("torch.ops.symm_mem.one_shot_all_reduce_out is missing in this torch")
            name = group.device_group.group_name
            enable = getattr(symm_mem, "enable_symm_mem_for_group", None)  # NOTE: needed before torch 2.8
            if enable is not None:
                enable(name)
            buffer = symm_mem.empty(max_bytes // 2, dtype=torch.bfloat16, device=group.device)
            handle = symm_mem.rendezvous(buffer, name)
        except Exception as err:  # NOTE: availability probe: any failure means "use NCCL"
            if required:
                raise RuntimeError(f"rank {group.rank}: one-shot all-reduce unavailable: {err}") from err
            warnings.warn(f"rank {group.rank}: one-shot all-reduce off, NCCL only: {err}", stacklevel=2)
            return None
        return cls(group, buffer, handle, max_bytes)

    def fits(self, x: torch.Tensor) -> bool:
        return x.is_cuda and x.numel() * x.element_size() <= self.max_bytes and x.is_contiguous()

    def staging(self, x: torch.Tensor) -> torch.Tensor:
        """A view of the symmetric buffer with ``x``'s shape and dtype (offset 0)."""
        flat = self.buffer.view(torch.uint8)[: x.numel() * x.element_size()]
        return flat.view(x.dtype).view(x.shape)

    def all_reduce_(self, x: torch.Tensor) -> None:
        staged = self.staging(x)
        staged.copy_(x)
        torch.ops.symm_mem.one_shot_all_reduce_out(staged, "sum", self.group_name, x)

    def close(self) -> None:
        self.buffer = self.handle = None  # type: ignore[assignment]
