"""The dense SwiGLU MLP (tensor-parallel): every dense layer's, and a MoE layer's shared expert."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from graphrt.models import ops
from graphrt.models.parallel import SINGLE, ColumnParallelLinear, RowParallelLinear, split
from graphrt.parallel import TPGroup


class MLP(nn.Module):
    """SwiGLU; ``gate_up`` column-parallel (gate and up blocks), ``down`` row-parallel.

    ``intermediate_size``: default ``cfg.intermediate_size`` (a shared expert has its own).
    """

    def __init__(self, cfg: Any, tp: TPGroup = SINGLE, intermediate_size: int | None = None) -> None:
        super().__init__()
        size = cfg.intermediate_size if intermediate_size is None else intermediate_size
        inner = split(size, tp, "intermediate_size")
        self.gate_up = ColumnParallelLinear(cfg.hidden_size, (inner, inner), ("gate", "up"))
        self.down = RowParallelLinear(inner, cfg.hidden_size, tp)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(ops.silu_and_mul(self.gate_up(x)))

    def partial(self, x: torch.Tensor) -> torch.Tensor:
        """This rank's share of ``forward(x)``: ``[T, H]`` before the all-reduce (a MoE layer
        sums its shared expert's with its routed experts' in one all-reduce)."""
        down = self.down
        return ops.linear(ops.silu_and_mul(self.gate_up(x)), down.weight, None, down.weight_scale)

    def gated_down(self, gate_up: torch.Tensor) -> torch.Tensor:
        """``down(silu(gate) * up)`` of ``gate_up [T, 2 I]``: one launch for a single-row step
        (:func:`ops.silu_mul_linear`), then under TP the down projection's all-reduce."""
        down = self.down
        if down.tp.size == 1:
            return ops.silu_mul_linear(gate_up, down.weight, down.bias, down.weight_scale)
        return down.reduce(ops.silu_mul_linear(gate_up, down.weight, None, down.weight_scale))
