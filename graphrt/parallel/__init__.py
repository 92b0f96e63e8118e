"""Tensor parallelism below the models: process groups, collectives the graphs capture, step broadcast.

:class:`TPGroup` is one rank's view of the tensor-parallel group (a device group for the
model's all-reduce / all-gather, a gloo group for host messages, one timeout for all).
:mod:`.ops` registers the collectives as ``torch.ops.graphrt`` ops so both capture engines
record them as single nodes; :mod:`.channel` sends rank 0's step to every rank (through
:mod:`.shm_ring` on one host) so every rank runs it.
"""

from graphrt.parallel.channel import Feed, Message, Op, StepChannel, pack, unpack
from graphrt.parallel.group import CollectiveError, TPGroup
from graphrt.parallel.ops import all_gather_last, all_reduce_
from graphrt.parallel.world import init_tp, shutdown

__all__ = [
    "CollectiveError",
    "Feed",
    "Message",
    "Op",
    "StepChannel",
    "TPGroup",
    "all_gather_last",
    "all_reduce_",
    "init_tp",
    "pack",
    "shutdown",
    "unpack",
]
