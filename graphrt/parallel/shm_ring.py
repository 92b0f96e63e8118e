"""Rank 0's step to the other ranks of one host through shared memory, in microseconds.

A gloo broadcast of the step costs every rank about ten times what this ring does
(``graphrt.tools.bench.tp``'s ``step_message_us``; docs/tensor-parallelism.md has the figures).
When every rank runs on one host, rank 0 writes the packed step into a ring of :data:`SLOTS` slots in a
``/dev/shm`` file instead, and the other ranks poll for it; each reader acknowledges what it
read, so rank 0 never overwrites a slot a reader has not finished.

Layout (int64 words): ``SLOTS`` slots of ``[seq, length, payload * SLOT_WORDS]``, then one ack
word per rank. A message longer than a slot is sent with ``length = -1`` and its values follow
over gloo (the caller's fallback), so order is kept. Every wait has the group's timeout and
raises :class:`CollectiveError` naming the rank.
"""

from __future__ import annotations

import mmap
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch.distributed as dist

from graphrt.kernels import switches
from graphrt.parallel.group import CollectiveError, TPGroup

SLOTS = 4
SLOT_WORDS = 4096  # payload int64 values per slot (32 KiB): a decode step of bs 800 fits
_SLOT = 2 + SLOT_WORDS
SHM_DIR = Path("/dev/shm")
#: The fence: a lock's acquire/release is a full barrier in CPython, so the payload is stored
#: before the sequence number that publishes it (and read after it), on x86 and Arm alike.
_FENCE = threading.Lock()


def _fence() -> None:
    _FENCE.acquire()
    _FENCE.release()


def _host_id() -> str:
    boot = Path("/proc/sys/kernel/random/boot_id")
    return socket.gethostname() + (":" + boot.read_text().strip() if boot.exists() else "")


class ShmRing:
    """One host's step ring for a TP group; rank 0 :meth:`send`\\ s, the others :meth:`recv`."""

    def __init__(self, group: TPGroup, mapped: mmap.mmap) -> None:
        self.group, self.mapped = group, mapped
        self.words = np.frombuffer(mapped, dtype=np.int64)
        self.acks = self.words[SLOTS * _SLOT :]
        self.seq = 0  # messages sent (rank 0) or received (the others)

    @classmethod
    def create(cls, group: TPGroup) -> ShmRing | None:
        """The ring, or ``None`` on every rank when any rank cannot use it (another host, no
        ``/dev/shm``, ``GRAPHRT_STEP_CHANNEL=gloo``). Collective over ``group.cpu_group``."""
        nbytes = (SLOTS * _SLOT + group.size) * 8
        path, mapped = None, None
        wanted = switches.active()["GRAPHRT_STEP_CHANNEL"] == "shm"
        if group.is_driver and wanted:
            path = SHM_DIR / f"graphrt-{uuid.uuid4().hex}"
            mapped = _map(path, nbytes, create=True)
        box = [path]  # NOTE: created before it is named, so the other ranks find it
        dist.broadcast_object_list(box, src=0, group=group.cpu_group)
        if not group.is_driver and box[0] is not None:
            mapped = _map(box[0], nbytes, create=False)
        views: list = [None] * group.size
        dist.all_gather_object(views, (_host_id(), mapped is not None), group=group.cpu_group)
        if path is not None:
            path.unlink(missing_ok=True)  # NOTE: every rank has mapped it or given up: no leak
        if all(ok for _, ok in views) and len({host for host, _ in views}) == 1:
            return cls(group, mapped)  # type: ignore[arg-type]
        if mapped is not None:
            mapped.close()
        return None

    def send(self, values: np.ndarray) -> bool:
        """Publish ``values`` (int64) to every reader; ``False``: too long, send them over gloo."""
        n = self.seq + 1
        self._wait(lambda: int(self.acks[1:].min()) >= n - SLOTS, f"step ring slot for message {n}")
        base = (n % SLOTS) * _SLOT
        fits = values.size <= SLOT_WORDS
        if fits:
            self.words[base + 2 : base + 2 + values.size] = values
        self.words[base + 1] = values.size if fits else -1
        _fence()
        self.words[base] = n
        self.seq = n
        return fits

    def recv(self) -> np.ndarray | None:
        """The next message's values, or ``None`` when they come over gloo (too long for a slot)."""
        n = self.seq + 1
        base = (n % SLOTS) * _SLOT
        self._wait(lambda: int(self.words[base]) == n, f"step {n} from rank 0")
        _fence()
        length = int(self.words[base + 1])
        values = self.words[base + 2 : base + 2 + length].copy() if length >= 0 else None
        _fence()
        self.acks[self.group.rank] = n
        self.seq = n
        return values

    def _wait(self, ready: Callable[[], bool], what: str) -> None:
        """Poll ``ready()``: spin briefly, then yield, then sleep; raise after the group's timeout."""
        if ready():
            return
        start = time.monotonic()
        spins = 0
        while not ready():
            spins += 1
            if spins < 200:
                continue
            waited = time.monotonic() - start
            if waited > self.group.timeout_s:
                g = self.group
                raise CollectiveError(
                    f"rank {g.rank} of {g.size}: waited {waited:.0f} s for {what} (timeout "
                    f"{g.timeout_s:g} s; another rank took a different path or died)"
                )
            time.sleep(0 if waited < 1e-3 else 5e-5 if waited < 0.1 else 1e-3)

    def close(self) -> None:
        del self.words, self.acks
        self.mapped.close()


def _map(path: Path, nbytes: int, create: bool) -> mmap.mmap | None:
    """``path`` mapped read-write (created zero-filled by rank 0), or ``None`` when it cannot be."""
    try:
        fd = os.open(path, os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0), 0o600)
    except OSError:
        return None  # NOTE: no /dev/shm, or another host's file: gloo carries the steps
    try:
        if create:
            os.ftruncate(fd, nbytes)  # NOTE: zero-filled: seq 0 and acks 0 mean "nothing yet"
        return mmap.mmap(fd, nbytes)
    finally:
        os.close(fd)


_RINGS: dict[str, ShmRing] = {}


def open_ring(group: TPGroup) -> ShmRing | None:
    """Create and register ``group``'s ring (every rank, once, after the group forms)."""
    ring = ShmRing.create(group)
    if ring is not None:
        _RINGS[group.name] = ring
    return ring


def ring_for(group: TPGroup) -> ShmRing | None:
    return _RINGS.get(group.name)


def close_rings() -> None:
    for ring in _RINGS.values():
        ring.close()
    _RINGS.clear()
