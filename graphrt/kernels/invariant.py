"""The batch-invariant GEMM of ``deterministic=True`` engines: row ``i`` of ``x @ W^T`` has the
same bits whatever the number of rows ``M`` beside it.

cuBLAS (and the skinny GEMM's tile table) pick another kernel, tile or split-K by ``M``, so one
request's logits change in the last bits with its batch mates and greedy choices can flip. Here
every ``M``, one decode row or a long prefill, takes :mod:`graphrt.kernels.skinny`'s kernel with
one fixed tile (:data:`TILE`) and :data:`BLOCK_M` rows per program, the rows spread over a
second grid axis: each row's products are summed by the same ``tl.dot`` over the same ``K``
tiles in the same order, with no split-K and no atomics.
"""

from __future__ import annotations

from dataclasses import astuple

import torch

from graphrt.kernels.skinny import Tile, pdl_default, problem

#: Rows per program, whatever ``M`` (the ``tl.dot`` minimum).
BLOCK_M = 16
#: The one tile for every shape and ``M`` (the skinny table's ``M <= 64`` rule: small enough
#: for ``x``'s share to stay in registers at ``BLOCK_M = 16``).
TILE = Tile(block_n=32, block_k=128, warps=4)


def fits(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> bool:
    """Whether :func:`invariant_linear` takes these tensors (any number of rows)."""
    return problem(x, weight, bias, max_m=None, wide=True) is None


def invariant_linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *, pdl: bool | None = None
) -> torch.Tensor:
    """``x @ weight^T (+ bias)`` whose row ``i`` has the same bits for any ``M``.

    Parameters
    ----------
    x : ``[M, K]``, bf16 or fp16, any ``M >= 1``, unit stride along ``K``.
    weight : ``[N, K]`` in ``x``'s dtype or float32, unit stride along ``K``.
    bias : ``[N]`` in ``weight``'s dtype, or None.
    pdl : launch with programmatic dependent launch (default: SM90+).

    Returns
    -------
    ``[M, N]`` in :func:`graphrt.kernels.skinny.out_dtype` (float32 for a float32 weight, else
    ``x``'s dtype): fp32 products and sums, the bias added in fp32, rounded once.
    Raises ``ValueError`` naming the value and the limit for tensors it cannot take.
    """
    why = problem(x, weight, bias, max_m=None, wide=True)
    if why is not None:
        raise ValueError(f"batch-invariant GEMM: {why}")
    n, k = weight.shape
    tile = TILE.fit(BLOCK_M, n, k)
    pdl = pdl_default(x.device) if pdl is None else pdl
    # NOTE: a negative last entry asks the launch for that many rows per program, whatever M
    return torch.ops.graphrt.skinny_gemm(x, weight, bias, [*astuple(tile), -BLOCK_M], pdl)
