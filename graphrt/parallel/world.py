"""Joining and leaving the ``torch.distributed`` world as one TP group, the ops registered on it."""

from __future__ import annotations

import gc
import os
from datetime import timedelta

import torch
import torch.distributed as dist

from graphrt.parallel.group import TPGroup, default_timeout_s
from graphrt.parallel.ops import register, unregister_all
from graphrt.parallel.shm_ring import close_rings, open_ring

_GROUPS: dict[tuple[int, str], TPGroup] = {}
_OWNED = False  # graphrt called init_process_group (so shutdown destroys it)


def rank_device(device: torch.device, rank: int) -> torch.device:
    """The device this rank computes on: ``cuda:LOCAL_RANK`` for a bare ``cuda``."""
    if device.type != "cuda" or device.index is not None:
        return device
    local = int(os.environ.get("LOCAL_RANK", rank % max(torch.cuda.device_count(), 1)))
    return torch.device("cuda", local)


def init_tp(size: int, device: torch.device, timeout_s: float | None = None) -> TPGroup:
    """The TP group of ``size`` ranks on ``device``: joins (or starts, under torchrun) the world.

    Raises ``ValueError`` when ``size`` is not the world size or no process group can be
    formed. Groups are cached, so several engines of one process share one.
    """
    if size < 1:
        raise ValueError(f"tp must be >= 1, got {size}")
    timeout_s = default_timeout_s() if timeout_s is None else timeout_s
    if size == 1:
        return TPGroup(device=device, timeout_s=timeout_s)
    key = (size, device.type)
    if key in _GROUPS:
        return _GROUPS[key]
    global _OWNED
    timeout = timedelta(seconds=timeout_s)
    if not dist.is_initialized():
        if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
            raise ValueError(
                f"tp={size} needs a process group: launch with `torchrun --nproc-per-node {size}` "
                "or call torch.distributed.init_process_group first"
            )
        backend = "nccl" if device.type == "cuda" else "gloo"
        if device.type == "cuda":
            torch.cuda.set_device(rank_device(device, int(os.environ["RANK"])))
        dist.init_process_group(backend, timeout=timeout)
        _OWNED = True
    world, rank = dist.get_world_size(), dist.get_rank()
    if world != size:
        raise ValueError(
            f"tp={size} but the process group has {world} ranks; graphrt's TP group is the world"
        )
    device = rank_device(device, rank)
    want = "nccl" if device.type == "cuda" else "gloo"
    if device.type == "cuda":
        torch.cuda.set_device(device)
    default = dist.get_backend()
    device_group = dist.group.WORLD if want in default else dist.new_group(backend=want, timeout=timeout)
    cpu_group = dist.new_group(backend="gloo", timeout=timeout)
    group = TPGroup(rank, size, device_group, cpu_group, device, timeout_s, f"tp{size}_{device.type}")
    register(group)
    open_ring(group)
    _GROUPS[key] = group
    return group


def shutdown() -> None:
    """Leave the TP groups: sync, meet every rank, then destroy the process group.

    Release captured graphs first (``Engine.close()``): ``destroy_process_group`` after
    graph-captured NCCL collectives can hang otherwise (pytorch #115388).
    """
    global _OWNED
    gc.collect()
    for group in list(_GROUPS.values()):
        if group.device.type == "cuda":
            torch.cuda.synchronize(group.device)
        group.barrier()
    unregister_all()
    close_rings()
    _GROUPS.clear()
    if _OWNED and dist.is_initialized():
        dist.destroy_process_group()
    _OWNED = False
