"""Our one-shot all-reduce over peer memory (``GRAPHRT_ALLREDUCE=p2p``): one Triton kernel a sum.

Where :class:`graphrt.parallel.symm.OneShot` runs a copy into the symmetric buffer and then
torch's one-shot kernel (two kernels, torch's barrier), :class:`PeerSum` launches one kernel
(:mod:`graphrt.parallel.p2p_kernel`) that stores ``x`` into the buffer, meets every peer at a
per-program barrier through the signal pads and sums every rank's slot in rank order, over
NVLink loads (no multicast). One buffer of two slots of ``max_bytes`` and the signal pads are
rendezvoused once, before any capture; graphs bake in their addresses. The default
(``GRAPHRT_ALLREDUCE=auto``) where every rank can set it up, because a small sum takes less
time this way than through torch's one-shot or NCCL (docs/tensor-parallelism.md has the figures).

:func:`reference_sum` is the same math in torch (the tests' oracle).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from graphrt.kernels.switches import KERNELS_PDL_ENV, pdl_enabled
from graphrt.parallel.p2p_kernel import BLOCK, blocks, launch

if TYPE_CHECKING:
    from graphrt.parallel.group import TPGroup

#: The dtypes the kernel sums (in fp32); others go through NCCL.
DTYPES = (torch.bfloat16, torch.float16, torch.float32)
#: Byte alignment of every slot and buffer address the kernel assumes (16-byte vectors).
ALIGN = 16


def reference_sum(parts: Sequence[torch.Tensor]) -> torch.Tensor:
    """Rank 0's ``x`` + rank 1's + ... in that order, in fp32, cast back: the kernel's exact result.

    ``parts``: one tensor per rank, same shape and dtype; returns that shape and dtype.
    """
    acc = parts[0].float()  # NOTE: not 0 + parts[0]: 0.0 + -0.0 is +0.0
    for part in parts[1:]:
        acc = acc + part.float()
    return acc.to(parts[0].dtype)


def fits(x: torch.Tensor, max_bytes: int, device: torch.device) -> bool:
    """Whether ``x`` goes through the kernel: on ``device``, contiguous, a summed dtype, small."""
    small = x.numel() * x.element_size() <= max_bytes
    return x.device == device and x.dtype in DTYPES and x.is_contiguous() and small


def check_capacity(max_bytes: int, world: int, pad_bytes: int) -> int:
    """Signal-pad rows (programs) a sum of up to ``max_bytes`` needs; an error when they don't fit.

    The kernel keeps one int32 flag per (program, rank) in each signal pad of ``pad_bytes``.
    """
    if max_bytes <= 0 or max_bytes % ALIGN:
        raise ValueError(f"p2p all-reduce max_bytes={max_bytes}: expected a positive multiple of {ALIGN}")
    rows = blocks(max_bytes // 2)  # NOTE: 2-byte dtypes take the most programs
    if rows * world * 4 > pad_bytes:
        raise ValueError(
            f"p2p all-reduce max_bytes={max_bytes} needs {rows} programs x {world} ranks int32 "
            f"flags ({rows * world * 4} bytes); the signal pad holds {pad_bytes} bytes "
            f"(lower GRAPHRT_P2P_MAX_BYTES to at most {pad_bytes // (4 * world) * 2 * BLOCK})"
        )
    return rows


class PeerSum:
    """``all_reduce_(x)`` for ``x`` of at most ``max_bytes`` (:func:`fits`), one kernel a sum."""

    def __init__(self, group: TPGroup, buffer: torch.Tensor, handle: Any, max_bytes: int, rows: int) -> None:
        self.group, self.buffer, self.handle, self.max_bytes = group, buffer, handle, max_bytes
        dev = group.device
        offset = buffer.data_ptr() - handle.buffer_ptrs[group.rank]
        addresses = [p + offset for p in handle.buffer_ptrs]
        if any(a % ALIGN for a in (*addresses, *handle.signal_pad_ptrs)):
            raise RuntimeError(f"rank {group.rank}: symmetric buffers not {ALIGN}-byte aligned: {addresses}")
        self.buffers = torch.tensor(addresses, dtype=torch.int64, device=dev)
        #: Where a sum that gave up on a peer writes that peer's rank + 1 before it traps: pinned
        #: host memory (mapped into the device under UVA), readable once the context is lost.
        self.stall = torch.zeros(1, dtype=torch.int32).pin_memory()
        self.pads = torch.tensor(
            [*handle.signal_pad_ptrs, self.stall.data_ptr()], dtype=torch.int64, device=dev
        )
        self.epochs = torch.zeros(rows, dtype=torch.int32, device=dev)
        self.pdl = pdl_enabled(KERNELS_PDL_ENV, dev)  # NOTE: the Triton kernels' one PDL switch

    @classmethod
    def create(cls, group: TPGroup, max_bytes: int) -> PeerSum:
        """Rendezvous the buffer and zero this rank's flags. Collective: every rank, same order."""
        import torch.distributed._symmetric_memory as symm_mem

        from graphrt.parallel.p2p_kernel import triton

        if triton is None:
            raise RuntimeError(
                f"rank {group.rank}: GRAPHRT_ALLREDUCE=p2p needs Triton, which is not importable"
            )
        name = group.device_group.group_name
        enable = getattr(symm_mem, "enable_symm_mem_for_group", None)  # NOTE: needed before torch 2.8
        if enable is not None:
            enable(name)
        buffer = symm_mem.empty(2 * max_bytes, dtype=torch.uint8, device=group.device)  # two slots
        handle = symm_mem.rendezvous(buffer, name)
        rows = check_capacity(max_bytes, group.size, handle.signal_pad_size)
        self = cls(group, buffer, handle, max_bytes, rows)
        # NOTE: flags only grow from 0 (epochs); zero ours, then wait for every rank to have
        # zeroed its own before anyone signals.
        handle.get_signal_pad(group.rank, [handle.signal_pad_size // 4], torch.int32).zero_()
        torch.cuda.synchronize(group.device)
        group.barrier()
        return self

    def fits(self, x: torch.Tensor) -> bool:
        return fits(x, self.max_bytes, self.group.device)

    def all_reduce_(self, x: torch.Tensor) -> None:
        """Sum ``x`` (contiguous, bf16/fp16/fp32, at most ``max_bytes``) over the ranks in place."""
        if not self.fits(x):
            raise ValueError(
                f"rank {self.group.rank}: p2p all-reduce of {x.numel() * x.element_size()} bytes "
                f"({x.dtype}, {x.device}, contiguous={x.is_contiguous()}): expected at most "
                f"{self.max_bytes} bytes of {', '.join(map(str, DTYPES))}, contiguous, on {self.group.device}"
            )
        g = self.group
        slot = self.max_bytes // x.element_size()
        launch(x, slot, self.buffers, self.pads, self.epochs, g.rank, g.size, self.pdl, g.timeout_s)

    def stalled_peer(self) -> int | None:
        """The peer a sum of this rank timed out waiting for (its kernel trapped), else None."""
        peer = int(self.stall[0])
        return peer - 1 if peer else None

    def close(self) -> None:
        self.buffer = self.handle = None  # type: ignore[assignment]
