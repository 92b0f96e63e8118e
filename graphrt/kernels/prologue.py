"""The skinny GEMM with its input's last op fused in: one launch where the unfused path has two.

A single-row decode step runs ~9 kernels per layer, each a few µs however small; the norms and
the SwiGLU activation read and write a few KB. Here the single-row (``M == 1``) skinny GEMM of
:mod:`graphrt.kernels.skinny` computes its own input while it loads it (the *prologue*):

- :func:`norm_linear`: ``rms_norm(h) @ W^T (+ b)`` with ``h = x``, or ``h = residual + x`` (the
  fused add + norm). The reduction over the hidden size is tiny (576-8192 values), so every
  program computes ``rsqrt(mean(h^2) + eps)`` itself in a first pass over ``h``; program 0 alone
  writes ``h`` (the new residual stream) to a new tensor no program of the launch reads.
- :func:`norm_keep_linear`: the same, program 0 also writing the normed row ``rms_norm(h)`` (the
  GEMM's rounded input) for the layer's other consumers: the MoE experts beside the router, MLA's
  ``kv_a_proj_with_mqa`` beside its first q projection. It takes a float32 weight too (a float32
  router): float32 output, as the skinny GEMM's.
- :func:`silu_mul_linear`: ``(silu(g) * u) @ W^T (+ b)`` of ``gate_up = [g | u]`` (gate first).

The activation is computed in fp32 and rounded to the activation dtype exactly where the unfused
torch ops round it (the sum ``residual + x``, the normed ``h``, the product ``silu(g) * u``;
:func:`graphrt.models.ops.rms_norm_ref`, :func:`~graphrt.models.ops.silu_and_mul_ref`), then
multiplied as the skinny GEMM multiplies: fp32 products and sums, the bias added in fp32, one
rounding. PDL as the skinny GEMM: weights and bias before ``gdc_wait()``, every input after it.

Each launch is one ``torch.ops.graphrt`` op (``prologue_norm_gemm``, ``prologue_norm_keep_gemm``,
``prologue_silu_gemm``, the names of their Triton kernels too; the two norm kernels are one
source with a constexpr flag), so the emulated capture engine records and replays it like any
aten op and both engines' kernel tables name it. ``GRAPHRT_FUSED_PROLOGUE``
(:mod:`graphrt.kernels.switches`) switches the fused kernels; ``GRAPHRT_SKINNY_GEMM=0`` turns them
off too (they are the skinny GEMM).
"""

from __future__ import annotations

from dataclasses import astuple
from typing import Any

import torch

from graphrt.kernels import prologue_triton as kernels
from graphrt.kernels import skinny, tuning
from graphrt.kernels.switches import triton, triton_enabled

ENV = "GRAPHRT_FUSED_PROLOGUE"


def enabled(device: torch.device) -> bool:
    """Whether the fused kernels run for tensors on ``device`` (:data:`ENV` and the skinny GEMM's switch)."""
    return triton_enabled(ENV, device) and skinny.enabled(device)


def _one_row(x: torch.Tensor) -> str | None:
    return None if x.dim() == 2 and x.shape[0] == 1 else f"x {tuple(x.shape)} is not one row [1, K]"


def norm_problem(
    x: torch.Tensor, residual: torch.Tensor | None, norm_weight: torch.Tensor, weight: torch.Tensor,
    bias: torch.Tensor | None = None, wide: bool = False,
) -> str | None:  # fmt: skip
    """What :func:`norm_linear` cannot take in these tensors (naming the value and the limit), or None.
    ``wide``: a float32 ``weight`` and ``bias`` are allowed (:func:`norm_keep_linear` takes them)."""
    problem = _one_row(x) or skinny.problem(x, weight, bias, wide=wide)
    if problem is not None:
        return problem
    if residual is not None and (
        residual.shape != x.shape or residual.dtype != x.dtype or residual.stride(1) != 1
    ):
        return f"residual {tuple(residual.shape)} {residual.dtype} is not x's {tuple(x.shape)} {x.dtype}, unit stride"
    if (
        norm_weight.shape != (x.shape[1],)
        or not norm_weight.is_floating_point()
        or norm_weight.stride(0) != 1
    ):
        return f"norm weight {tuple(norm_weight.shape)} is not a contiguous float vector of {x.shape[1]}"
    devices = {x.device, norm_weight.device} | ({residual.device} if residual is not None else set())
    return "x, residual and norm weight are on different devices" if len(devices) != 1 else None


def silu_problem(gate_up: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> str | None:
    """What :func:`silu_mul_linear` cannot take in these tensors, or None."""
    problem = _one_row(gate_up)
    if problem is None and (weight.dim() != 2 or gate_up.shape[1] != 2 * weight.shape[1]):
        problem = f"gate_up {tuple(gate_up.shape)} is not [1, 2 K] for weight {tuple(weight.shape)} [N, K]"
    return problem or skinny.problem(gate_up[:, : weight.shape[1]], weight, bias)


def norm_linear(
    x: torch.Tensor, residual: torch.Tensor | None, norm_weight: torch.Tensor, eps: float,
    weight: torch.Tensor, bias: torch.Tensor | None = None, *, tile: skinny.Tile | None = None,
    pdl: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """``rms_norm(h, norm_weight, eps) @ weight^T (+ bias)`` and ``h``, with ``h = residual + x``.

    Parameters
    ----------
    x : ``[1, K]`` bf16 or fp16, unit stride: the previous sublayer's output.
    residual : ``[1, K]`` in ``x``'s dtype, or None (then ``h = x``, the first block's input).
    norm_weight : ``[K]``, any float dtype. eps : the norm's epsilon.
    weight, bias, tile, pdl : as :func:`graphrt.kernels.skinny.skinny_linear`.

    Returns
    -------
    ``(y [1, N], h [1, K])``, both new tensors in ``x``'s dtype (``h``: ``residual + x`` rounded
    once, or a copy of ``x``); no input is written. ``ValueError`` naming the value when the
    kernel cannot take the tensors (:func:`norm_problem`).
    """
    problem = norm_problem(x, residual, norm_weight, weight, bias)
    if problem is not None:
        raise ValueError(f"fused norm + GEMM: {problem}")
    args = _tile_args(x, weight, tile, pdl, norm=True)
    y, h = torch.ops.graphrt.prologue_norm_gemm(x, residual, norm_weight, float(eps), weight, bias, *args)
    return y, h


def norm_keep_linear(
    x: torch.Tensor, residual: torch.Tensor | None, norm_weight: torch.Tensor, eps: float,
    weight: torch.Tensor, bias: torch.Tensor | None = None, *, tile: skinny.Tile | None = None,
    pdl: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
    """:func:`norm_linear` that also returns the normed row: ``(y, normed, h)``.

    ``normed [1, K]`` in ``x``'s dtype is ``rms_norm(h, norm_weight, eps)`` rounded as the GEMM's
    input is (:func:`graphrt.models.ops.rms_norm_ref`'s rounding), a new tensor written by
    program 0. ``weight [N, K]`` and ``bias [N]`` in ``x``'s dtype, or both float32 (then ``y
    [1, N]`` is float32: ``F.linear(normed.float(), weight, bias)`` up to the summation order).
    Arguments and errors otherwise as :func:`norm_linear`.
    """
    problem = norm_problem(x, residual, norm_weight, weight, bias, wide=True)
    if problem is not None:
        raise ValueError(f"fused norm + GEMM keeping the normed row: {problem}")
    args = _tile_args(x, weight, tile, pdl, norm=True)
    y, normed, h = torch.ops.graphrt.prologue_norm_keep_gemm(
        x, residual, norm_weight, float(eps), weight, bias, *args
    )
    return y, normed, h


def silu_mul_linear(
    gate_up: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *,
    tile: skinny.Tile | None = None, pdl: bool | None = None,
) -> torch.Tensor:  # fmt: skip
    """``(silu(gate) * up) @ weight^T (+ bias)`` of ``gate_up [1, 2 K] = [gate | up]``: ``[1, N]``.

    ``weight [N, K]`` and ``bias [N]`` in ``gate_up``'s dtype (bf16 or fp16), unit stride along
    ``K``; ``tile`` and ``pdl`` as :func:`graphrt.kernels.skinny.skinny_linear`.
    """
    problem = silu_problem(gate_up, weight, bias)
    if problem is not None:
        raise ValueError(f"fused SiLU-and-mul + GEMM: {problem}")
    return torch.ops.graphrt.prologue_silu_gemm(
        gate_up, weight, bias, *_tile_args(gate_up, weight, tile, pdl)
    )


def tile_for(n: int, k: int, norm: bool) -> skinny.Tile:
    """The tile of a fused kernel (``norm``: the norm kernel, else SiLU's) for a ``[N, K]`` weight,
    from the active tuning table (:mod:`graphrt.kernels.tuning`): its tile for the shape, else its
    norm tile for the norm kernel, else the skinny GEMM's single-row rule.

    NOTE: every program recomputes ``rsqrt(mean(h^2))`` over all of ``h``, so the norm kernel's
    tile trades programs against that repeated work (docs/gpu.md has the H100 figures)."""
    tile = tuning.active().prologue_tile(n, k, norm)
    return skinny.tile_for(1, n, k) if tile is None else tile.fit(1, n, k)


def _tile_args(
    x: torch.Tensor, weight: torch.Tensor, tile: skinny.Tile | None, pdl: bool | None, norm: bool = False
) -> tuple:
    """``([block_n, block_k, warps, stages], pdl)``: the op's launch arguments, fixed per shape."""
    n, k = weight.shape
    tile = tile_for(n, k, norm) if tile is None else tile.fit(1, n, k)
    pdl = skinny.pdl_default(x.device) if pdl is None else pdl
    return list(astuple(tile)), pdl


def _launch_options(x: torch.Tensor, k: int, tile: list[int], pdl: bool) -> dict:
    block_n, block_k, warps, stages = tile
    return dict(
        BLOCK_N=block_n, BLOCK_K=block_k, BF16=x.dtype == torch.bfloat16, PDL=pdl, ONE_TILE=k <= block_k,
        num_warps=warps, num_stages=stages, launch_pdl=pdl,
    )  # fmt: skip


def _norm_gemm(
    x: torch.Tensor, residual: torch.Tensor | None, norm_weight: torch.Tensor, eps: float,
    weight: torch.Tensor, bias: torch.Tensor | None, tile: list[int], pdl: bool,
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    y = torch.empty((1, weight.shape[0]), dtype=x.dtype, device=x.device)
    h = torch.empty_like(x)
    _launch_norm(kernels.prologue_norm_gemm, x, residual, norm_weight, eps, weight, bias, tile, pdl, (y, h))
    return y, h


def _norm_keep_gemm(
    x: torch.Tensor, residual: torch.Tensor | None, norm_weight: torch.Tensor, eps: float,
    weight: torch.Tensor, bias: torch.Tensor | None, tile: list[int], pdl: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
    y = torch.empty((1, weight.shape[0]), dtype=skinny.out_dtype(x, weight), device=x.device)
    normed, h = torch.empty_like(x), torch.empty_like(x)
    outs = (y, h, normed)
    _launch_norm(
        kernels.prologue_norm_keep_gemm, x, residual, norm_weight, eps, weight, bias, tile, pdl, outs,
        WIDE=y.dtype == skinny.WIDE,
    )  # fmt: skip
    return y, normed, h


def _launch_norm(
    kernel: Any, x: torch.Tensor, residual: torch.Tensor | None, norm_weight: torch.Tensor, eps: float,
    weight: torch.Tensor, bias: torch.Tensor | None, tile: list[int], pdl: bool,
    outs: tuple[torch.Tensor, ...], **flags: bool,
) -> None:  # fmt: skip
    """One of the norm kernels over ``weight``'s rows, writing ``outs`` (``y``, ``h`` [, ``normed``])."""
    assert triton is not None, "the fused prologue needs Triton"
    n, k = weight.shape
    kernel[(triton.cdiv(n, tile[0]),)](
        x, x if residual is None else residual, norm_weight, weight, weight if bias is None else bias,
        *outs, n, k, weight.stride(0), eps, ADD=residual is not None, HAS_BIAS=bias is not None,
        **flags, **_launch_options(x, k, tile, pdl),
    )  # fmt: skip


def _silu_gemm(
    gate_up: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, tile: list[int], pdl: bool
) -> torch.Tensor:
    assert triton is not None, "the fused prologue needs Triton"
    n, k = weight.shape
    y = torch.empty((1, n), dtype=gate_up.dtype, device=gate_up.device)
    kernels.prologue_silu_gemm[(triton.cdiv(n, tile[0]),)](
        gate_up, weight, weight if bias is None else bias, y, n, k, weight.stride(0),
        HAS_BIAS=bias is not None, **_launch_options(gate_up, k, tile, pdl),
    )  # fmt: skip
    return y


# NOTE: a fragment of the ``graphrt`` namespace (graphrt.parallel.ops defines the collectives).
_LIB = torch.library.Library("graphrt", "FRAGMENT")
_LIB.define(
    "prologue_norm_gemm(Tensor x, Tensor? residual, Tensor norm_weight, float eps, Tensor weight, "
    "Tensor? bias, int[] tile, bool pdl) -> (Tensor, Tensor)"
)
_LIB.define(
    "prologue_norm_keep_gemm(Tensor x, Tensor? residual, Tensor norm_weight, float eps, Tensor weight, "
    "Tensor? bias, int[] tile, bool pdl) -> (Tensor, Tensor, Tensor)"
)
_LIB.define("prologue_silu_gemm(Tensor gate_up, Tensor weight, Tensor? bias, int[] tile, bool pdl) -> Tensor")
_LIB.impl("prologue_norm_gemm", _norm_gemm, "CompositeExplicitAutograd")
_LIB.impl("prologue_norm_keep_gemm", _norm_keep_gemm, "CompositeExplicitAutograd")
_LIB.impl("prologue_silu_gemm", _silu_gemm, "CompositeExplicitAutograd")
