"""Where one checkpoint tensor lands in a model's parameters."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from graphrt.models.parallel import Shard, copy_shard, whole

Shape = tuple[int, ...]
#: A checkpoint tensor made into the parameter's layout after it is read (gpt-oss's experts).
Transform = Callable[[torch.Tensor], torch.Tensor]


@dataclass(frozen=True, slots=True)
class Slot:
    """Where a checkpoint tensor lands: ``shard`` of parameter ``param`` (of its slice ``index``
    along dim 0 when set: one expert of a 3-D expert weight, or a run of experts when a slice:
    a fused shared expert's pieces); ``shape`` is what the checkpoint must hold (the full
    tensor, whatever the TP size). ``transform`` (then ``expect``: the
    checkpoint's shape) turns the tensor read into the parameter's layout first: all of it, or
    ``read`` when set (a tensor-parallel rank's slice of a transposed or interleaved tensor)."""

    param: str
    shard: Shard
    index: int | slice | None = None
    transform: Transform | None = None
    expect: Shape | None = None
    read: Shard | None = None

    @property
    def shape(self) -> Shape:
        return self.shard.shape if self.expect is None else self.expect

    @property
    def read_shard(self) -> Shard:
        """What to read of the checkpoint tensor: the shard, or when transformed ``read`` (else all of it)."""
        if self.expect is None:
            return self.shard
        return whole(self.expect) if self.read is None else self.read

    def view(self, param: torch.Tensor) -> torch.Tensor:
        """The part of ``param`` this checkpoint tensor fills (padding excluded)."""
        target = param if self.index is None else param[self.index]
        return target.narrow(self.shard.dim, self.shard.dest, self.shard.length)

    def load(self, param: torch.Tensor, piece: torch.Tensor) -> None:
        """Copy ``piece`` (what :attr:`read_shard` read) into ``param``."""
        if self.transform is not None:
            piece = self.transform(piece)
        copy_shard(param if self.index is None else param[self.index], piece, self.shard)
