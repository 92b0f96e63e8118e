"""Rank 0's step, broadcast to the other ranks before they run it: one small message.

On one host the message goes through the group's shared-memory ring (:mod:`.shm_ring`, a few
µs); otherwise, or when it is longer than a ring slot, through one gloo broadcast.

A :class:`Message` (op, target runtime, eager flag, and the step's :class:`Batch`) packs into
one int64 tensor: a header, then ``input_ids``, ``seq_lens``, ``req_pool_indices``,
``out_cache_loc``, ``q_lens``, the flattened ``tree_mask`` and each row's ``SamplingParams``
(so a sampled step returns the same tokens on every rank). Over gloo, steps up to
:data:`CAPACITY` values take one broadcast; a longer one (a large prefill) sends its tail in a
second.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from enum import IntEnum
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.distributed as dist

from graphrt.parallel.shm_ring import ring_for
from graphrt.step.batch import Batch
from graphrt.step.modes import ForwardMode
from graphrt.step.sampling import SamplingParams

if TYPE_CHECKING:
    from graphrt.parallel.group import TPGroup

CAPACITY = 4096  # int64 values in the first broadcast (32 KiB)
MAGIC = 0x67727274  # "grrt"
_MODES = list(ForwardMode)
_ARRAYS = ("input_ids", "seq_lens", "req_pool_indices", "out_cache_loc", "q_lens")
_HEADER = 7 + len(_ARRAYS) + 2  # magic, op, target, eager, mode, total, feed, sizes..., tree n, sampled
#: Per-row sampling columns after the tree mask: three floats as their int64 bits, then two ints.
_FLOATS, _INTS = ("temperature", "top_p", "min_p"), ("top_k", "seed")


class Op(IntEnum):
    RUN = 1  # run ``batch`` on runtime ``target``
    STOP = 2  # the driver's call ended normally
    ABORT = 3  # the driver's call raised; an object broadcast with the error follows
    IDLE = 4  # no step: rank 0 is alive (a server's heartbeat, within the group's timeout)


class Feed(IntEnum):
    """A step's token feed (:mod:`graphrt.runtime.feed`), as the message names it."""

    NONE = 0  # input ids from the batch, tokens not recorded
    RECORD = 1  # a prefill: input ids from the batch, its sampled tokens recorded
    GATHER = 2  # a fed DECODE: FED input ids gathered from the feed in the graph, tokens recorded


@dataclass(frozen=True, slots=True)
class Message:
    op: Op
    target: int = 0
    eager: bool = False
    batch: Batch | None = None
    feed: Feed = Feed.NONE


def pack(msg: Message) -> np.ndarray:
    """``msg`` as one int64 array (see the module docstring)."""
    b = msg.batch
    arrays = [getattr(b, name) for name in _ARRAYS] if b is not None else []
    tree = -1 if b is None or b.tree_mask is None else b.tree_mask.shape[-1]
    if tree >= 0:
        arrays.append(b.tree_mask.reshape(-1).astype(np.int64))  # type: ignore[union-attr]
    sizes = [a.size for a in arrays[: len(_ARRAYS)]] or [0] * len(_ARRAYS)
    sampled = -1 if b is None or b.sampling is None else len(b.sampling)
    if sampled >= 0:
        arrays.append(_sampling_columns(b.sampling))  # type: ignore[union-attr, arg-type]
    mode = _MODES.index(b.mode) if b is not None else -1
    body = np.concatenate(arrays).astype(np.int64) if arrays else np.zeros(0, np.int64)
    header = [
        MAGIC,
        int(msg.op),
        msg.target,
        int(msg.eager),
        mode,
        _HEADER + body.size,
        int(msg.feed),
        *sizes,
        tree,
        sampled,
    ]
    return np.concatenate([np.asarray(header, np.int64), body])


def unpack(values: np.ndarray) -> Message:
    """The :class:`Message` :func:`pack` wrote into ``values``."""
    if int(values[0]) != MAGIC:
        raise RuntimeError(f"step broadcast is corrupt (magic {int(values[0]):#x})")
    op, target, eager, mode = (int(v) for v in values[1:5])
    if mode < 0:
        return Message(Op(op), target, bool(eager))
    feed = Feed(int(values[6]))
    sizes = [int(v) for v in values[7 : 7 + len(_ARRAYS)]]
    tree, sampled = int(values[_HEADER - 2]), int(values[_HEADER - 1])
    bounds = np.cumsum([_HEADER, *sizes])
    fields = {name: values[bounds[i] : bounds[i + 1]].copy() for i, name in enumerate(_ARRAYS)}
    at, bs, mask, params = int(bounds[-1]), sizes[1], None, None
    if tree >= 0:
        mask = values[at : at + bs * tree * tree].reshape(bs, tree, tree).astype(bool)
        at += bs * tree * tree
    if sampled >= 0:
        params = _sampling_params(values[at : at + sampled * (len(_FLOATS) + len(_INTS))], sampled)
    batch = Batch(_MODES[mode], tree_mask=mask, sampling=params, **fields)
    return Message(Op(op), target, bool(eager), batch, feed)


def _sampling_columns(params: tuple[SamplingParams, ...]) -> np.ndarray:
    """Each row's sampling parameters as int64s: float bits first, then ``top_k`` and ``seed``
    (``-1``: none). Stop tokens stay on rank 0: the engine, not the step, acts on them."""
    floats = np.array([[getattr(p, f) for f in _FLOATS] for p in params], np.float64).reshape(-1)
    ints = [[p.top_k, -1 if p.seed is None else p.seed] for p in params]
    return np.concatenate([floats.view(np.int64), np.array(ints, np.int64).reshape(-1)])


def _sampling_params(values: np.ndarray, rows: int) -> tuple[SamplingParams, ...]:
    floats = values[: rows * len(_FLOATS)].copy().view(np.float64).reshape(rows, len(_FLOATS))
    ints = values[rows * len(_FLOATS) :].reshape(rows, len(_INTS))
    return tuple(
        SamplingParams(float(t), int(k), float(top_p), float(min_p), None if s < 0 else int(s))
        for (t, top_p, min_p), (k, s) in zip(floats, ints, strict=True)
    )


class StepChannel:
    """Rank 0 → every rank: the group's shared-memory ring, else gloo, with the group's timeout."""

    def __init__(self, group: TPGroup, use_ring: bool = True) -> None:
        self.group = group
        self.ring = ring_for(group) if group.size > 1 and use_ring else None
        #: Held from a step's send to the end of its run (``TPRuntime.run``), so that with
        #: several threads rank 0 runs its steps in the order the other ranks receive them.
        self.lock = threading.RLock()

    def exchange(self, msg: Message | None) -> Message:
        """Rank 0 sends ``msg``; every rank returns rank 0's message (others pass ``None``)."""
        g = self.group
        if g.size == 1:
            assert msg is not None
            return msg
        packed = None
        if g.is_driver:
            if msg is None:
                raise ValueError("rank 0 drives: it must send a message")
            packed = pack(msg)
            if self.ring is None or not self.ring.send(packed):
                self._broadcast(packed)
            return msg
        values = self.ring.recv() if self.ring is not None else None
        return unpack(values if values is not None else self._broadcast(None))

    def _broadcast(self, packed: np.ndarray | None) -> np.ndarray:
        """Rank 0's ``packed`` values on every rank over gloo: ``CAPACITY`` values, then any tail."""
        g = self.group
        buf = torch.zeros(CAPACITY, dtype=torch.int64)
        if packed is not None:
            head = min(packed.size, CAPACITY)
            buf[:head] = torch.from_numpy(packed[:head])
        g.guard("step broadcast", lambda: dist.broadcast(buf, src=0, group=g.cpu_group))
        total = int(buf[5])
        if total <= CAPACITY:
            return buf.numpy()
        tail = torch.zeros(total - CAPACITY, dtype=torch.int64)
        if packed is not None:
            tail.copy_(torch.from_numpy(packed[CAPACITY:]))
        g.guard("step broadcast (tail)", lambda: dist.broadcast(tail, src=0, group=g.cpu_group))
        return np.concatenate([buf.numpy(), tail.numpy()])

    def share(self, obj: Any) -> Any:
        """Rank 0's ``obj`` on every rank (pickled; for call arguments, results and errors)."""
        g = self.group
        if g.size == 1:
            return obj
        box = [obj if g.is_driver else None]
        g.guard("object broadcast", lambda: dist.broadcast_object_list(box, src=0, group=g.cpu_group))
        return box[0]
