"""RMSNorm and the fused steps around it: the residual add, and the GEMM that reads the normed row.

:class:`RMSNorm` holds the weight and ``eps``; its methods pick :mod:`graphrt.models.ops`'
fused kernels (sgl-kernel's add + norm, the GEMM prologues of :mod:`graphrt.kernels.prologue`)
where they apply and the torch definitions elsewhere.
"""

from __future__ import annotations

import torch
from torch import nn

from graphrt.models import ops
from graphrt.models.parallel import ColumnParallelLinear


class RMSNorm(nn.Module):
    """RMSNorm over the last dim (sgl-kernel's fused kernel on GPU, see :mod:`graphrt.models.ops`)."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1])  # NOTE: the fused kernel takes 2-D rows
        return ops.rms_norm(flat, self.weight, self.eps).view(x.shape)

    def add(self, x: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``residual + x`` and its norm: ``(normed, new residual)`` (one fused kernel on GPU)."""
        return ops.add_rms_norm(x, residual, self.weight, self.eps)

    def stream(self, x: torch.Tensor, residual: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`add`, or for the first block (``residual`` None, ``x`` the stream) the norm of ``x``."""
        return ops.norm_stream(x, residual, self.weight, self.eps)

    def linear(
        self, x: torch.Tensor, residual: torch.Tensor | None, proj: ColumnParallelLinear
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(proj(norm(residual + x)), residual + x)`` of ``x, residual [T, H]`` (``residual``
        None: ``x`` is the stream); one launch for a single-row step (:func:`ops.add_norm_linear`).
        ``proj`` is column-parallel: a plain GEMM of this rank's columns, no collective."""
        return ops.add_norm_linear(
            x, residual, self.weight, self.eps, proj.weight, proj.bias, proj.weight_scale
        )

    def linear_keep(
        self, x: torch.Tensor, residual: torch.Tensor | None, proj: nn.Linear
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(proj(n), n, h)`` with ``h = residual + x`` and ``n = norm(h)``, for a normed row
        with several consumers; one launch for a single-row step (:func:`ops.add_norm_linear_keep`)."""
        return ops.add_norm_linear_keep(x, residual, self.weight, self.eps, proj.weight, proj.bias)
