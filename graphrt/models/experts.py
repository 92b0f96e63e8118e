"""A MoE layer's routed experts as 3-D weights, tensor-parallel along each expert's intermediate dim.

Every rank holds every expert (no expert parallelism) and, of each, the columns ``part`` of the
intermediate dim ``I``: the gate and up rows ``part`` of ``w13`` and the same columns of
``w2``, as the dense MLP splits ``gate_up`` and ``down``. The SwiGLU (clamped or not) is
elementwise over ``I``, so a rank's partial output is ``sum_k w_k * down_r(act(x up_r))``
and the layer sums the ranks' partials with the dense MLP's all-reduce. Parameters carry
``full_shape``, ``shard(part)`` and ``weight_loader`` like every sharded layer
(:mod:`graphrt.models.parallel`).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from graphrt.kernels.moe import ExpertWeights
from graphrt.models.moe_config import MoESpec
from graphrt.models.parallel import SINGLE, Part, Shard, copy_shard, cut, split
from graphrt.parallel import TPGroup

#: The fused gate/up weight's blocks along its dim 1, in order.
BLOCKS = ("gate", "up")


def block_index(part: int | str | None) -> int:
    """``0`` (gate) or ``1`` (up) of a block named by index or by :data:`BLOCKS` name."""
    if part is None:
        raise ValueError("a fused gate/up expert weight: name the block (part 'gate' or 'up')")
    return BLOCKS.index(part) if isinstance(part, str) else part


def _loader(shard: Callable[..., Shard], blocks: int) -> Callable[..., None]:
    def load(param: nn.Parameter, loaded: torch.Tensor, part: int | str | None = None) -> None:
        if part is None and blocks > 1:  # NOTE: the whole fused tensor: each block's shard in turn
            for i, block in enumerate(loaded.chunk(blocks, dim=1)):
                load(param, block, i)
            return
        s = shard(part)
        copy_shard(param, cut(loaded, s), s)

    return load


def gate_up_param(lead: tuple[int, ...], inner: Part, rest: tuple[int, ...]) -> nn.Parameter:
    """``[*lead, 2 part.size, *rest]`` holding this rank's rows of each of the gate and up blocks
    of a full ``[*lead, 2 I, *rest]`` (``lead`` is ``(E,)``: the block dim is dim 1)."""

    def shard(part: int | str | None = None) -> Shard:
        j = block_index(part)
        stop = inner.start + inner.size
        return Shard(1, inner.start, stop, j * inner.size, inner.size, (*lead, inner.full, *rest))

    p = nn.Parameter(torch.empty(*lead, 2 * inner.size, *rest))
    p.full_shape = (*lead, 2 * inner.full, *rest)  # type: ignore[attr-defined]
    p.shard = shard  # type: ignore[attr-defined]
    p.weight_loader = _loader(shard, len(BLOCKS))  # type: ignore[attr-defined]
    return p


def down_param(num_experts: int, hidden: int, inner: Part) -> nn.Parameter:
    """``[E, H, part.size]``: this rank's columns of a full ``[E, H, I]``."""
    cols = Shard(2, inner.start, inner.start + inner.size, 0, inner.size, (num_experts, hidden, inner.full))
    p = nn.Parameter(torch.empty(num_experts, hidden, inner.size))
    p.full_shape = cols.shape  # type: ignore[attr-defined]
    p.shard = lambda part=None: cols  # type: ignore[attr-defined]
    p.weight_loader = _loader(p.shard, 1)  # type: ignore[attr-defined]
    return p


class Experts(nn.Module):
    """``spec.total_experts`` SwiGLU experts, this rank's slice ``inner`` of each intermediate dim:
    the routed ones, then the shared expert's :attr:`~MoESpec.shared_slots` pieces where it is
    fused (loaded from its own checkpoint tensors, :mod:`graphrt.checkpoints.shared_experts`).

    ``w13 [E, 2 i, H]`` (this rank's gate rows then its up rows), ``w2 [E, H, i]`` with ``i =
    I / tp``; with ``bias`` also ``b13 [E, 2 i]`` (split like ``w13``) and ``b2 [E, H]``
    (replicated, added by rank 0 only so the all-reduce counts it once). Raises ``ValueError``
    naming ``I`` and the TP size when the size does not divide ``I``.
    """

    def __init__(self, spec: MoESpec, hidden_size: int, tp: TPGroup = SINGLE) -> None:
        super().__init__()
        e, h = spec.total_experts, hidden_size
        self.inner = split(spec.expert_size, tp, "the experts' intermediate size")
        self.activation = spec.activation
        self.w13 = gate_up_param((e,), self.inner, (h,))
        self.w2 = down_param(e, h, self.inner)
        self.b13 = gate_up_param((e,), self.inner, ()) if spec.expert_bias else None
        self.b2 = nn.Parameter(torch.empty(e, h)) if spec.expert_bias else None
        # NOTE: b2 is inside every expert's output, so it would be summed tp times
        self.adds_b2 = tp.rank == 0

    def weights(self) -> ExpertWeights:
        """This rank's :class:`ExpertWeights` (``b2`` only on rank 0)."""
        b2 = self.b2 if self.adds_b2 else None
        return ExpertWeights(self.w13, self.w2, self.b13, b2, self.activation)
