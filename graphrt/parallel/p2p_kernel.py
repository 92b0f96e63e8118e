"""One-shot all-reduce over peer memory as one Triton kernel (CUDA, one host, no multicast).

Every rank launches the same grid; program ``b`` owns elements ``[b * BLOCK, (b + 1) * BLOCK)``
of ``x`` and does, on its own:

1. store its slice of ``x`` into this rank's symmetric buffer, slot ``epoch & 1``;
2. a barrier with program ``b`` of every peer through the signal pads: write ``epoch + 1``
   into flag ``[b, rank]`` of each peer's pad (release, system scope), then spin until flag
   ``[b, r]`` of its own pad reaches ``epoch + 1`` for every peer ``r`` (acquire, system scope);
3. load the slice from every rank's slot in rank order ``0..W-1``, sum in fp32 and store the sum
   into ``x`` in ``x``'s dtype. Every rank adds in the same order, so all get the same bits.

``epoch`` is program ``b``'s count of earlier launches, kept in device memory (``epochs[b]``)
and bumped at the end: a graph replay carries it on, and it is equal on every rank because
every rank runs the same launches. Flags only grow, so nothing is reset (replay-safe) and a
stale flag from an earlier launch never passes a later barrier.

Why two slots and one barrier (not one slot and a second barrier at the end): a fast rank's
program ``b`` at launch ``e`` writes slot ``e & 1`` before its barrier, while the slow peer's
program ``b`` may still read slot ``(e - 1) & 1`` of launch ``e - 1``; the slot written is the
one read at launch ``e - 2``, and the fast rank passed barrier ``e - 1`` only once the peer
had started launch ``e - 1``, i.e. finished launch ``e - 2`` (same stream). A second barrier
would cost one more NVLink round trip per sum.
"""

from __future__ import annotations

import torch

from graphrt.kernels.switches import tl, triton

#: Elements per program: one 16-byte vector per thread for bf16 at 4 warps.
BLOCK = 1024
NUM_WARPS = 4

if triton is not None:

    @triton.jit
    def _now_ns():
        """The GPU's global nanosecond timer."""
        return tl.inline_asm_elementwise(
            "mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64, is_pure=False, pack=1
        )

    @triton.jit
    def _trap(after):
        """Abort the kernel once ``after`` (int32) is in hand: the context takes a sticky error,
        so the host's next sync raises. ``after`` is the stall word's old value: a scalar atomic
        runs on one thread, and every thread must wait for its return (and ``membar.sys`` for
        the write to reach host memory) before one trap discards what is still in flight."""
        tl.inline_asm_elementwise(
            "membar.sys; trap; mov.u32 $0, $1;", "=r,r", [after], dtype=tl.int32, is_pure=False, pack=1
        )

    @triton.jit
    def _peer_barrier(
        pads, pid, epoch, timeout_ns, RANK: tl.constexpr, WORLD: tl.constexpr, DEADLINE: tl.constexpr
    ):
        """Program ``pid``'s flag exchange with program ``pid`` of every peer (see the module).

        One scalar flag per peer (unrolled over the ranks): a ``[WORLD]`` vector of flags spun on
        in a loop does not compile with Triton 3.6 (``TritonGPURemoveLayoutConversions`` fails).
        ``DEADLINE``: a peer that has not arrived after ``timeout_ns`` traps the kernel (a dead
        or diverged rank becomes an error on this one, never a hang), after writing the peer's
        rank + 1 into the stall word at ``pads[WORLD]`` (host memory, so the host can still read
        it once the context is lost); off under the interpreter, which runs no PTX.
        """
        target = epoch + 1
        # NOTE: every thread's slot stores come before the release (bar.sync, then the flag
        # writes: the release is cumulative over what the CTA wrote).
        tl.debug_barrier()
        for r in tl.static_range(WORLD):
            if r != RANK:
                remote = tl.load(pads + r).to(tl.pointer_type(tl.int32))
                tl.atomic_xchg(remote + pid * WORLD + RANK, target, sem="release", scope="sys")
        local = tl.load(pads + RANK).to(tl.pointer_type(tl.int32)) + pid * WORLD
        for r in tl.static_range(WORLD):
            if r != RANK:
                # NOTE: signed difference, so the epoch may wrap around; a peer may already be one
                # launch ahead (its flag at target + 1), never behind once it has written target.
                seen = tl.atomic_add(local + r, 0, sem="acquire", scope="sys")
                if DEADLINE:
                    start = _now_ns()
                while seen - target < 0:
                    seen = tl.atomic_add(local + r, 0, sem="acquire", scope="sys")
                    if DEADLINE:  # noqa: SIM102 - a constexpr branch: no timer read when off
                        if _now_ns() - start > timeout_ns:
                            stall = tl.load(pads + WORLD).to(tl.pointer_type(tl.int32))
                            _trap(tl.atomic_xchg(stall, r + 1, sem="release", scope="sys"))
        tl.debug_barrier()  # NOTE: the acquire seen by one thread orders every thread's loads

    @triton.jit
    def p2p_all_reduce(
        x,
        n,
        slot_elems,
        buffers,
        pads,
        epochs,
        timeout_ns,
        RANK: tl.constexpr,
        WORLD: tl.constexpr,
        BLOCK: tl.constexpr,
        PDL: tl.constexpr,
        DEADLINE: tl.constexpr,
    ):
        """``x[:n] = sum over ranks r = 0..WORLD-1 of x_r[:n]`` (fp32 sum, in ``x``'s dtype).

        ``buffers``/``pads``: int64 addresses of every rank's symmetric buffer (``[WORLD]``, two
        slots of ``slot_elems`` elements) and signal pad (int32 flags ``[blocks, WORLD]``), then,
        with ``DEADLINE``, of this rank's int32 stall word (``pads[WORLD]``);
        ``epochs``: ``[blocks]`` int32, this rank's launches per program.
        """
        pid = tl.program_id(0)
        offs = pid * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        if PDL:  # NOTE: launched early (programmatic dependent launch): x is the previous kernel's
            tl.extra.cuda.gdc_wait()
            tl.extra.cuda.gdc_launch_dependents()
        mine = tl.load(x + offs, mask=mask)
        epoch = tl.load(epochs + pid)
        slot = (epoch & 1) * slot_elems
        ty = x.dtype.element_ty
        own = tl.multiple_of(tl.load(buffers + RANK).to(tl.pointer_type(ty)), 16)
        tl.store(own + slot + offs, mine, mask=mask)
        _peer_barrier(pads, pid, epoch, timeout_ns, RANK, WORLD, DEADLINE)
        acc = tl.zeros([BLOCK], tl.float32)
        for r in tl.static_range(WORLD):
            if r == RANK:
                part = mine.to(tl.float32)
            else:
                peer = tl.multiple_of(tl.load(buffers + r).to(tl.pointer_type(ty)), 16)
                part = tl.load(peer + slot + offs, mask=mask).to(tl.float32)
            # NOTE: rank 0's value itself, not 0 + it: 0.0 + -0.0 would turn -0.0 into +0.0.
            acc = part if r == 0 else acc + part
        tl.store(x + offs, acc.to(ty), mask=mask)
        tl.store(epochs + pid, epoch + 1)


def launch(
    x: torch.Tensor,
    slot_elems: int,
    buffers: torch.Tensor,
    pads: torch.Tensor,
    epochs: torch.Tensor,
    rank: int,
    world: int,
    pdl: bool = False,
    timeout_s: float = 120.0,
) -> None:
    """Sum contiguous ``x`` (any float dtype, ``x.numel() <= slot_elems``) over the ranks in place.

    ``buffers``: ``[world]``, ``pads``: ``[world + 1]`` int64 on ``x.device`` (``pads[world]``: the
    address of an int32 stall word in pinned host memory; read only on CUDA); ``epochs``: int32, at least
    :func:`blocks` ``(x.numel())`` entries. Every rank must launch with the same ``x.numel()``.
    ``pdl``: launch with programmatic dependent launch (the kernel waits before it reads ``x``, so
    its launch overlaps the previous kernel's tail, and lets the next kernel launch at once).
    ``timeout_s``: on CUDA, a program that waits longer than this for a peer traps the kernel.
    """
    n = x.numel()
    p2p_all_reduce[(blocks(n),)](
        x, n, slot_elems, buffers, pads, epochs, int(timeout_s * 1e9), RANK=rank, WORLD=world,
        BLOCK=BLOCK, PDL=pdl, DEADLINE=x.is_cuda, num_warps=NUM_WARPS, launch_pdl=pdl,
    )  # fmt: skip


def blocks(numel: int) -> int:
    """Programs (and signal-pad rows) a sum of ``numel`` elements takes."""
    return -(-numel // BLOCK)
