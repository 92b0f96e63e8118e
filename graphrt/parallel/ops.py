"""The model's collectives as ``torch.ops.graphrt`` ops, so a graph records each as one node.

``graphrt::all_reduce_(Tensor(a!) x, str comm)`` sums ``x`` over the TP group in place;
``graphrt::all_gather(Tensor x, str comm) -> Tensor [size, *x.shape]`` stacks every rank's
``x``. Both capture engines see one op: the CUDA engine records the collective's kernels on
the capture stream (NCCL, or a one-shot symmetric-memory kernel for small messages), the
emulated engine records the op and re-issues it over gloo on replay. ``comm`` names a
:class:`Communicator` registered once per group, before the first capture.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from graphrt.kernels import switches

if TYPE_CHECKING:
    from graphrt.parallel.group import TPGroup

_LIB = torch.library.Library("graphrt", "DEF")
_LIB.define("all_reduce_(Tensor(a!) x, str comm) -> ()")
_LIB.define("all_gather(Tensor x, str comm) -> Tensor")


@dataclass(frozen=True, slots=True)
class SmallSums:
    """How a ``GRAPHRT_ALLREDUCE`` mode sums small messages on CUDA (NCCL above ``limit_env``).

    ``build(group, max_bytes, required)``: the path, or ``None`` when it is unusable here
    (``required``: an error instead). Collective: every rank builds it, before any capture.
    """

    build: Callable[[TPGroup, int, bool], Any]
    limit_env: str
    required: bool


def _oneshot(group: TPGroup, max_bytes: int, required: bool) -> Any:
    from graphrt.parallel.symm import OneShot

    return OneShot.create(group, max_bytes, required=required)


def _p2p(group: TPGroup, max_bytes: int, required: bool) -> Any:
    from graphrt.parallel.p2p import PeerSum

    try:
        path, why = PeerSum.create(group, max_bytes), ""
    except Exception as err:  # NOTE: availability probe (Triton, symmetric memory, peer access)
        if required:  # NOTE: asked for by name: its absence is an error, never a silent NCCL
            raise RuntimeError(f"rank {group.rank}: GRAPHRT_ALLREDUCE=p2p unavailable: {err}") from err
        path, why = None, str(err)
    if required:
        return path
    # NOTE: every rank must take the same path, or a p2p sum would wait for a peer inside NCCL
    if not group.all_true(path is not None, "p2p all-reduce agreement"):
        if path is not None:
            path.close()
        warnings.warn(
            f"rank {group.rank}: p2p all-reduce off, NCCL only: {why or 'off on a peer'}", stacklevel=2
        )
        return None
    return path


#: ``GRAPHRT_ALLREDUCE`` values: ``None`` is NCCL for every sum.
MODES: dict[str, SmallSums | None] = {
    "nccl": None,
    "auto": SmallSums(_p2p, "GRAPHRT_P2P_MAX_BYTES", required=False),
    "oneshot": SmallSums(_oneshot, "GRAPHRT_ONESHOT_MAX_BYTES", required=True),
    "p2p": SmallSums(_p2p, "GRAPHRT_P2P_MAX_BYTES", required=True),
}
#: The mode when ``GRAPHRT_ALLREDUCE`` is unset.
DEFAULT_MODE = "auto"
#: Bytes up to which a mode's small path takes a sum, unless its ``limit_env`` says otherwise.
DEFAULT_MAX_BYTES = 256 * 1024


def small_sums(mode: str) -> SmallSums | None:
    """The small-message path of ``GRAPHRT_ALLREDUCE=mode`` (``None``: NCCL only)."""
    if mode not in MODES:
        raise ValueError(f"GRAPHRT_ALLREDUCE={mode!r}: expected one of {', '.join(MODES)}")
    return MODES[mode]


def max_bytes(name: str) -> int:
    """The byte limit of switch ``name`` (default ``DEFAULT_MAX_BYTES``; :mod:`graphrt.kernels.switches`)."""
    return int(switches.active()[name])


class Communicator:
    """One group's collectives: NCCL/gloo through ``torch.distributed``, a faster path for small sums.

    ``GRAPHRT_ALLREDUCE`` (:data:`MODES`): ``auto`` (default: our one-kernel one-shot,
    :mod:`graphrt.parallel.p2p`, for sums up to ``GRAPHRT_P2P_MAX_BYTES`` on CUDA when every rank
    can set it up, NCCL above and otherwise, with a warning), ``p2p`` (the same, but an error when
    it cannot be set up), ``oneshot`` (torch's symmetric-memory one-shot up to
    ``GRAPHRT_ONESHOT_MAX_BYTES``; an error when unusable) or ``nccl`` (NCCL for every sum).
    ``auto`` is the default because the one-kernel sum is faster than NCCL's for a step's small
    messages (docs/tensor-parallelism.md has the measurements). CPU groups (gloo) ignore the mode.
    """

    def __init__(self, group: TPGroup) -> None:
        self.group = group
        #: The small-sum path (:class:`~graphrt.parallel.symm.OneShot` or
        #: :class:`~graphrt.parallel.p2p.PeerSum`), or ``None``: NCCL/gloo for every sum.
        self.small: Any = None
        mode = small_sums(str(switches.active()["GRAPHRT_ALLREDUCE"]))
        if group.device.type == "cuda" and mode is not None:
            self.small = mode.build(group, max_bytes(mode.limit_env), mode.required)

    def warm_up(self) -> None:
        """Run each collective once eagerly: communicators connect here, never inside a capture."""
        g = self.group
        sums = {"all-reduce": torch.ones(4, device=g.device)}
        self.all_reduce_(sums["all-reduce"])
        self.all_gather(sums["all-reduce"])
        if self.small is not None:
            sums["small-sum path"] = torch.ones(8, device=g.device, dtype=torch.bfloat16)
            self.small.all_reduce_(sums["small-sum path"])
        if g.device.type == "cuda":
            torch.cuda.synchronize(g.device)
        for what, got in sums.items():
            if not torch.equal(got.float().cpu(), torch.full(got.shape, float(g.size))):
                raise RuntimeError(f"rank {g.rank}: warm-up {what} gave {got.tolist()}, expected {g.size}")

    def all_reduce_(self, x: torch.Tensor) -> None:
        if self.small is not None and self.small.fits(x):
            self.small.all_reduce_(x)
            return
        g = self.group
        g.guard("all_reduce", lambda: dist.all_reduce(x, group=g.device_group))

    def all_gather(self, x: torch.Tensor) -> torch.Tensor:
        g = self.group
        out = x.new_empty(g.size * x.numel())
        flat = x.contiguous().view(-1)
        g.guard("all_gather", lambda: _GATHER(out, flat, group=g.device_group))
        return out.view(g.size, *x.shape)


#: ``all_gather_single`` replaces ``all_gather_into_tensor`` in newer torch (same semantics).
_GATHER = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor

_COMMS: dict[str, Communicator] = {}


def register(group: TPGroup) -> Communicator:
    """Create, warm up and register ``group``'s communicator (every rank, before any capture)."""
    comm = _COMMS[group.name] = Communicator(group)
    comm.warm_up()
    return comm


def unregister_all() -> None:
    for comm in _COMMS.values():
        if comm.small is not None:
            comm.small.close()
    _COMMS.clear()


def stalled_sum() -> str | None:
    """Why the CUDA context was lost, when a p2p sum gave up waiting for a peer (else None)."""
    for comm in _COMMS.values():
        peer = getattr(comm.small, "stalled_peer", lambda: None)()
        if peer is not None:
            g = comm.group
            return (
                f"rank {g.rank} of {g.size}: a p2p all-reduce waited more than {g.timeout_s:g} s "
                f"(GRAPHRT_TP_TIMEOUT) for rank {peer} and trapped: that rank died or took another "
                "path; this process's CUDA context is lost, restart every rank"
            )
    return None


def communicator(name: str) -> Communicator:
    comm = _COMMS.get(name)
    if comm is None:
        raise RuntimeError(f"no TP communicator {name!r} (registered: {sorted(_COMMS)}); call init_tp first")
    return comm


def _all_reduce_impl(x: torch.Tensor, comm: str) -> None:
    communicator(comm).all_reduce_(x)


def _all_gather_impl(x: torch.Tensor, comm: str) -> torch.Tensor:
    return communicator(comm).all_gather(x)


def _all_gather_meta(x: torch.Tensor, comm: str) -> torch.Tensor:
    return x.new_empty((communicator(comm).group.size, *x.shape))


_LIB.impl("all_reduce_", _all_reduce_impl, "CompositeExplicitAutograd")
_LIB.impl("all_gather", _all_gather_impl, "CompositeExplicitAutograd")
_LIB.impl("all_gather", _all_gather_meta, "Meta")


def all_reduce_(x: torch.Tensor, group: TPGroup) -> torch.Tensor:
    """Sum ``x`` over ``group`` in place (a no-op for one rank); returns ``x``."""
    if group.size > 1:
        torch.ops.graphrt.all_reduce_(x, group.name)
    return x


def all_gather_last(x: torch.Tensor, group: TPGroup) -> torch.Tensor:
    """``[..., n]`` on each rank → ``[..., size * n]``, rank 0's columns first."""
    if group.size == 1:
        return x
    stacked = torch.ops.graphrt.all_gather(x, group.name)  # [size, ..., n]
    return stacked.movedim(0, -2).reshape(*x.shape[:-1], group.size * x.shape[-1])
