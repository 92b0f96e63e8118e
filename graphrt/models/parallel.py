"""Sharded layers: each knows its slice of the full weight and narrows a full tensor into it.

Every parameter carries ``full_shape`` (its unsharded shape) and ``weight_loader(param,
loaded, part=None)``: ``loaded`` is the full tensor (or, with ``part``, one named block of a
fused weight such as a checkpoint's ``k_proj``), and the loader copies this rank's rows or
columns. Seeded init and checkpoint loaders both go through it, so a rank only ever keeps
its slices. With one rank every layer is its plain counterpart (same shapes, no collective).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

from graphrt.parallel import TPGroup, all_gather_last, all_reduce_

SINGLE = TPGroup()


@dataclass(frozen=True, slots=True)
class Part:
    """Rows ``start .. start + size`` of a ``full``-row block are this rank's."""

    full: int
    start: int
    size: int


def split(full: int, tp: TPGroup, what: str) -> Part:
    """An even split of ``full`` over the group; raises naming both numbers when it is not."""
    if full % tp.size:
        raise ValueError(f"tensor-parallel size {tp.size} does not divide {what} {full}")
    size = full // tp.size
    return Part(full, tp.rank * size, size)


def vocab_split(vocab_size: int, tp: TPGroup) -> Part:
    """``ceil(vocab / tp)`` rows per rank (any TP size); the last rank's rows past the vocabulary
    are zero padding, never looked up, and their logits are cut off after the gather."""
    size = -(-vocab_size // tp.size)
    return Part(vocab_size, tp.rank * size, size)


def _narrow_rows(loaded: torch.Tensor, part: Part) -> torch.Tensor:
    """Rows ``part`` of ``loaded``, zero-padded past its end (a padded vocabulary shard)."""
    rows = loaded[part.start : part.start + part.size]
    if rows.shape[0] == part.size:
        return rows
    pad = rows.new_zeros((part.size - rows.shape[0], *rows.shape[1:]))
    return torch.cat((rows, pad))


def kv_heads(num_kv_heads: int, num_heads: int, tp: TPGroup) -> Part:
    """KV heads of this rank: split when ``tp`` divides them, else the one its query heads read.

    With fewer KV heads than ranks each KV head is replicated on ``tp / num_kv_heads`` ranks
    (query head ``h`` reads KV head ``h // (num_heads / num_kv_heads)``).
    """
    split(num_heads, tp, "num_heads")
    if num_kv_heads % tp.size == 0:
        return split(num_kv_heads, tp, "num_kv_heads")
    if tp.size % num_kv_heads:
        raise ValueError(
            f"tensor-parallel size {tp.size} does not divide num_kv_heads {num_kv_heads} "
            f"(nor does num_kv_heads divide it, so KV heads cannot be replicated)"
        )
    return Part(num_kv_heads, tp.rank * num_kv_heads // tp.size, 1)


def _loader_param(shape: Sequence[int], full_shape: Sequence[int], loader: object) -> nn.Parameter:
    p = nn.Parameter(torch.empty(*shape))
    p.full_shape = tuple(full_shape)  # type: ignore[attr-defined]
    p.weight_loader = loader  # type: ignore[attr-defined]
    return p


class ColumnParallelLinear(nn.Module):
    """``y = x W^T`` with W's output rows split: one or more fused blocks (``parts``), no collective.

    ``names`` name the blocks (``("q", "k", "v")``) for loaders that bring them one by one.
    """

    def __init__(self, in_features: int, parts: Sequence[Part], names: Sequence[str] = ()) -> None:
        super().__init__()
        self.parts, self.names = tuple(parts), tuple(names)
        local, full = sum(p.size for p in parts), sum(p.full for p in parts)
        self.weight = _loader_param((local, in_features), (full, in_features), self.load)

    @torch.no_grad()
    def load(self, param: nn.Parameter, loaded: torch.Tensor, part: int | str | None = None) -> None:
        if part is None:
            blocks = loaded.split([p.full for p in self.parts], dim=0)
            local = [_narrow_rows(b, p) for b, p in zip(blocks, self.parts, strict=True)]
            param.copy_(torch.cat(local, dim=0))
            return
        i = self.names.index(part) if isinstance(part, str) else part
        offset, p = sum(q.size for q in self.parts[:i]), self.parts[i]
        param[offset : offset + p.size].copy_(_narrow_rows(loaded, p))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight)


class RowParallelLinear(nn.Module):
    """``y = sum over ranks of x_r W_r^T``: W's input columns split, one all-reduce after."""

    def __init__(self, cols: Part, out_features: int, tp: TPGroup) -> None:
        super().__init__()
        self.cols, self.tp = cols, tp
        self.weight = _loader_param((out_features, cols.size), (out_features, cols.full), self.load)

    @torch.no_grad()
    def load(self, param: nn.Parameter, loaded: torch.Tensor, part: int | str | None = None) -> None:
        param.copy_(loaded.narrow(1, self.cols.start, self.cols.size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return all_reduce_(F.linear(x, self.weight), self.tp)


class VocabParallelEmbedding(nn.Module):
    """Rows of the embedding split by token id; rows of other ranks' ids are 0, then summed."""

    def __init__(self, vocab_size: int, hidden_size: int, tp: TPGroup) -> None:
        super().__init__()
        self.rows, self.tp = vocab_split(vocab_size, tp), tp
        self.weight = _loader_param((self.rows.size, hidden_size), (vocab_size, hidden_size), self.load)

    @torch.no_grad()
    def load(self, param: nn.Parameter, loaded: torch.Tensor, part: int | str | None = None) -> None:
        param.copy_(_narrow_rows(loaded, self.rows))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if self.tp.size == 1:
            return F.embedding(ids, self.weight)
        # NOTE: arithmetic masking, no boolean indexing: no host sync inside a graph.
        local = ids - self.rows.start
        mine = (local >= 0) & (local < self.rows.size)
        out = F.embedding(local * mine, self.weight) * mine[:, None].to(self.weight.dtype)
        return all_reduce_(out, self.tp)


class ParallelLMHead(ColumnParallelLinear):
    """Vocabulary-parallel head: each rank's logits columns, all-gathered to ``[T, vocab]``."""

    def __init__(self, hidden_size: int, vocab_size: int, tp: TPGroup) -> None:
        super().__init__(hidden_size, [vocab_split(vocab_size, tp)])
        self.tp, self.vocab_size = tp, vocab_size

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = all_gather_last(F.linear(x, self.weight), self.tp)
        return logits if logits.shape[-1] == self.vocab_size else logits[..., : self.vocab_size]
