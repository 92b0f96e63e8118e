"""Sharded layers: each knows its slice of the full weight and narrows a full tensor into it.

Every parameter carries ``full_shape`` (its unsharded shape), ``shard(part=None)`` (the
:class:`Shard` of a full tensor, or with ``part`` of one named block of a fused weight such as
a checkpoint's ``k_proj``, that this rank keeps) and ``weight_loader(param, loaded, part=None)``
(copies that shard out of a full ``loaded``). Seeded init goes through ``weight_loader``;
checkpoint loaders read only the ``shard`` from the file (:func:`copy_shard`), so a rank only
ever holds its slices. With one rank every layer is its plain counterpart (same shapes, no
collective).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

from graphrt.kernels import fp8_gemm
from graphrt.models.ops import linear
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


def scaled(part: Part, by: int) -> Part:
    """``part`` in units ``by`` times larger (heads → rows of ``head_dim`` each)."""
    return Part(part.full * by, part.start * by, part.size * by)


@dataclass(frozen=True, slots=True)
class Shard:
    """Indices ``start:stop`` along ``dim`` of a checkpoint tensor of ``shape`` are this rank's.

    They land at ``dest:dest + (stop - start)`` of the parameter along the same dim; the
    parameter's ``size - (stop - start)`` indices after them are zero padding (the last
    rank's vocabulary rows past the vocabulary).
    """

    dim: int
    start: int
    stop: int
    dest: int
    size: int
    shape: tuple[int, ...]

    @property
    def length(self) -> int:
        return self.stop - self.start


def whole(shape: Sequence[int]) -> Shard:
    """The shard of a replicated parameter (every rank keeps all of it)."""
    return Shard(0, 0, shape[0], 0, shape[0], tuple(shape))


def row_shard(part: Part, dest: int, rest: Sequence[int]) -> Shard:
    """Rows ``part`` of a ``[part.full, *rest]`` tensor, clipped to its end, at row ``dest``."""
    start, stop = min(part.start, part.full), min(part.start + part.size, part.full)
    return Shard(0, start, stop, dest, part.size, (part.full, *rest))


@torch.no_grad()
def copy_shard(param: torch.Tensor, piece: torch.Tensor, shard: Shard) -> None:
    """Copy ``piece`` (the shard, already cut out of the full tensor) into ``param``; zero the padding."""
    param.narrow(shard.dim, shard.dest, shard.length).copy_(piece)
    if shard.length < shard.size:
        param.narrow(shard.dim, shard.dest + shard.length, shard.size - shard.length).zero_()


def cut(loaded: torch.Tensor, shard: Shard) -> torch.Tensor:
    """The shard's indices of a full tensor ``loaded``."""
    return loaded.narrow(shard.dim, shard.start, shard.length)


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


Sharding = Callable[[int | str | None], Shard]
#: What a sharded parameter carries beyond its data.
ATTRS = ("full_shape", "shard", "weight_loader")


def to_empty(module: nn.Module, device: torch.device) -> nn.Module:
    """``module.to_empty(device=device)`` keeping every parameter's :data:`ATTRS`.

    NOTE: moving off the meta device makes new ``Parameter`` objects, which drops them.
    """
    kept = {n: {a: getattr(p, a) for a in ATTRS if hasattr(p, a)} for n, p in module.named_parameters()}
    # NOTE: not ``module.to_empty``: its ``empty_like`` of a meta tensor runs torch's Python
    # reference, which imports sympy (0.7 s of a cold start); parameters are contiguous.
    module = module._apply(lambda t: torch.empty(t.shape, dtype=t.dtype, device=device))
    for name, p in module.named_parameters():
        for attr, value in kept.get(name, {}).items():
            setattr(p, attr, value)
    return module


def _loader_param(shape: Sequence[int], full_shape: Sequence[int], shard: Sharding) -> nn.Parameter:
    """A parameter with ``full_shape``, ``shard(part)`` and a ``weight_loader`` built on them."""
    p = nn.Parameter(torch.empty(*shape))
    p.full_shape = tuple(full_shape)  # type: ignore[attr-defined]
    p.shard = shard  # type: ignore[attr-defined]
    p.weight_loader = _loader(shard)  # type: ignore[attr-defined]
    return p


def head_param(heads: Part) -> nn.Parameter:
    """A vector with one entry per query head (attention sinks), split like the heads: this
    rank's ``heads.size`` entries of a ``[heads.full]`` tensor."""
    entries = row_shard(heads, 0, ())
    return _loader_param((heads.size,), (heads.full,), lambda part=None: entries)


def _loader(shard: Sharding) -> Callable[..., None]:
    def load(param: nn.Parameter, loaded: torch.Tensor, part: int | str | None = None) -> None:
        s = shard(part)
        copy_shard(param, cut(loaded, s), s)

    return load


def quantize_weight(module: nn.Module) -> None:
    """Replace ``module.weight`` by its e4m3 rows and register their float32 ``weight_scale``.

    Per row of this rank's shard (a column-parallel shard keeps whole rows; a row-parallel one's
    rows are this rank's columns of each output, scaled on their own)."""
    q, scale = fp8_gemm.quantize(module.weight)
    module.weight = nn.Parameter(q, requires_grad=False)
    module.weight_scale = scale  # NOTE: a buffer: moves with the module


class ColumnParallelLinear(nn.Module):
    """``y = x W^T`` with W's output rows split: one or more fused blocks (``parts``), no collective.

    ``names`` name the blocks (``("q", "k", "v")``) for loaders that bring them one by one;
    ``bias`` rows are split like the weight's.
    """

    def __init__(
        self, in_features: int, parts: Sequence[Part], names: Sequence[str] = (), bias: bool = False
    ) -> None:
        super().__init__()
        self.parts, self.names = tuple(parts), tuple(names)
        local, full = sum(p.size for p in parts), sum(p.full for p in parts)
        self.weight = _loader_param((local, in_features), (full, in_features), self._sharding(in_features))
        self.bias = _loader_param((local,), (full,), self._sharding()) if bias else None
        # NOTE: per-row float32 scales once the weight is FP8 (quantize_fp8), else None
        self.register_buffer("weight_scale", None, persistent=False)
        for p in (self.weight, self.bias):
            if p is not None:  # NOTE: a fused tensor at once: every block's shard in turn
                p.weight_loader = self._fused_loader(p.weight_loader)  # type: ignore[attr-defined]

    def _sharding(self, *rest: int) -> Sharding:
        def shard(part: int | str | None = None) -> Shard:
            if part is None and len(self.parts) != 1:
                raise ValueError(f"a fused weight of {len(self.parts)} blocks: name the block (part)")
            i = self.names.index(part) if isinstance(part, str) else (part or 0)
            return row_shard(self.parts[i], sum(q.size for q in self.parts[:i]), rest)

        return shard

    def _fused_loader(self, load: Callable[..., None]) -> Callable[..., None]:
        def fused(param: nn.Parameter, loaded: torch.Tensor, part: int | str | None = None) -> None:
            if part is not None or len(self.parts) == 1:
                return load(param, loaded, part)
            for i, block in enumerate(loaded.split([p.full for p in self.parts], dim=0)):
                load(param, block, i)

        return fused

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias, self.weight_scale)

    def quantize_fp8(self) -> None:
        """Hold this rank's weight as e4m3 with per-row scales (:mod:`graphrt.kernels.fp8_gemm`)."""
        quantize_weight(self)


class RowParallelLinear(nn.Module):
    """``y = sum over ranks of x_r W_r^T (+ b)``: W's input columns split, one all-reduce after.

    The ``bias`` is replicated and added once, after the all-reduce.
    """

    def __init__(self, cols: Part, out_features: int, tp: TPGroup, bias: bool = False) -> None:
        super().__init__()
        self.cols, self.tp = cols, tp
        full = (out_features, cols.full)
        columns = Shard(1, cols.start, cols.start + cols.size, 0, cols.size, full)
        self.weight = _loader_param((out_features, cols.size), full, lambda part=None: columns)
        bias_shard = whole((out_features,))
        self.bias = (
            _loader_param((out_features,), (out_features,), lambda part=None: bias_shard) if bias else None
        )
        self.register_buffer("weight_scale", None, persistent=False)  # NOTE: as the column layer's

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.reduce(linear(x, self.weight, None, self.weight_scale))

    def quantize_fp8(self) -> None:
        """Hold this rank's weight as e4m3 with per-row scales (:mod:`graphrt.kernels.fp8_gemm`)."""
        quantize_weight(self)

    def reduce(self, partial: torch.Tensor) -> torch.Tensor:
        """This rank's ``x_r W_r^T`` summed over the ranks, plus the bias (once)."""
        out = all_reduce_(partial, self.tp)
        return out if self.bias is None else out + self.bias


class VocabParallelEmbedding(nn.Module):
    """Rows of the embedding split by token id; rows of other ranks' ids are 0, then summed."""

    def __init__(self, vocab_size: int, hidden_size: int, tp: TPGroup) -> None:
        super().__init__()
        self.rows, self.tp = vocab_split(vocab_size, tp), tp
        rows = row_shard(self.rows, 0, (hidden_size,))
        self.weight = _loader_param(
            (self.rows.size, hidden_size), (vocab_size, hidden_size), lambda part=None: rows
        )

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
        logits = all_gather_last(linear(x, self.weight), self.tp)
        return logits if logits.shape[-1] == self.vocab_size else logits[..., : self.vocab_size]
