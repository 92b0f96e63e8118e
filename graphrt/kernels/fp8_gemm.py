"""FP8 weights: per-channel e4m3 quantization and the skinny GEMM that streams them.

A weight ``W [N, K]`` is held as ``q [N, K]`` ``float8_e4m3fn`` and ``scale [N]`` float32 with
``W ≈ q * scale[:, None]``: each output row's largest magnitude maps to the format's largest
finite value (448). A decode step reads half the bytes of a bf16 weight.

:func:`fp8_linear` computes ``y = (x @ q^T) * scale (+ b)``: the products and sums in float32,
the scale and bias applied once per output in float32, rounded once to ``x``'s dtype. On CUDA
(or under Triton's interpreter) steps of at most :data:`MAX_M` rows take one Triton launch per
call, the skinny GEMM's program layout (:mod:`graphrt.kernels.skinny`: weight tiles loaded
before the PDL wait, no split-K, no atomics) with e4m3 tiles widened in registers; other steps
(prefill) and the CPU take :func:`fp8_linear_ref`, the same math in torch.
"""

from __future__ import annotations

from dataclasses import astuple

import torch

from graphrt.kernels import skinny
from graphrt.kernels.skinny import MAX_M, tile_for
from graphrt.kernels.switches import tl, triton

FP8 = torch.float8_e4m3fn
#: The largest finite e4m3 value: a row's largest magnitude maps to it.
FP8_MAX = float(torch.finfo(FP8).max)
#: The smallest scale a row gets (an all-zero row would otherwise divide by zero).
MIN_SCALE = 1e-12


def quantize(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(q [N, K] float8_e4m3fn, scale [N] float32)`` of ``weight [N, K]``, per output row."""
    w = weight.detach().float()
    scale = (w.abs().amax(dim=1) / FP8_MAX).clamp(min=MIN_SCALE)
    q = (w / scale[:, None]).clamp(-FP8_MAX, FP8_MAX).to(FP8)
    return q, scale


def dequantize(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``q * scale[:, None]`` in float32: the weight an FP8 pair stands for."""
    return q.float() * scale[:, None]


def fp8_linear_ref(
    x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """``(x @ q^T) * scale (+ bias)`` in float32, rounded once to ``x``'s dtype (any rows)."""
    y = torch.nn.functional.linear(x.float(), q.float()) * scale
    if bias is not None:
        y = y + bias.float()
    return y.to(x.dtype)


def problem(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None) -> str | None:
    """What the kernel cannot take (naming the value and the limit), or None."""
    if x.dim() != 2 or q.dim() != 2 or x.shape[1] != q.shape[1]:
        return f"x {tuple(x.shape)} and weight {tuple(q.shape)} are not [M, K] and [N, K]"
    if not 0 < x.shape[0] <= MAX_M:
        return f"x has {x.shape[0]} rows; the kernel takes 1..{MAX_M}"
    if q.dtype != FP8 or scale.dtype != torch.float32 or scale.shape != (q.shape[0],):
        return f"weight {q.dtype} / scale {scale.dtype} {tuple(scale.shape)}: want {FP8} and float32 [N]"
    if x.dtype not in skinny.DTYPES or (bias is not None and bias.dtype != x.dtype):
        return f"x {x.dtype}, bias {None if bias is None else bias.dtype}: one of {skinny.DTYPES}"
    if x.stride(1) != 1 or q.stride(1) != 1 or not scale.is_contiguous():
        return "x and weight need a contiguous last dim, scale a contiguous vector"
    return None


def fp8_linear(
    x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """``x @ (q * scale)^T (+ bias)``: ``x [..., K]`` bf16/fp16/fp32, ``q [N, K]`` e4m3,
    ``scale [N]`` float32, ``bias [N]``; returns ``[..., N]`` in ``x``'s dtype.

    One Triton launch where the kernel runs (:func:`problem` is None and the skinny GEMM's switch
    is on for ``x``'s device); else :func:`fp8_linear_ref`.
    """
    rows = x if x.dim() == 2 else x.reshape(-1, x.shape[-1])
    if skinny.enabled(x.device) and problem(rows, q, scale, bias) is None:
        m, k = rows.shape
        tile = tile_for(m, q.shape[0], k)
        out = torch.ops.graphrt.fp8_gemm(
            rows, q, scale, bias, list(astuple(tile)), skinny.pdl_default(x.device)
        )
        return out.view(*x.shape[:-1], q.shape[0])
    return fp8_linear_ref(x, q, scale, bias)


def _fp8_gemm(
    x: torch.Tensor,
    q: torch.Tensor,
    scale: torch.Tensor,
    bias: torch.Tensor | None,
    tile: list[int],
    pdl: bool,
) -> torch.Tensor:
    assert triton is not None, "the FP8 GEMM needs Triton"
    (m, k), n = x.shape, q.shape[0]
    block_n, block_k, warps, stages = tile
    block_m = skinny.block_m(m)
    out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    _fp8_skinny[(triton.cdiv(n, block_n), triton.cdiv(m, block_m))](
        x, q, scale, q if bias is None else bias, out, m, n, k, x.stride(0), q.stride(0),
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, HAS_BIAS=bias is not None, PDL=pdl,
        F32_DOT=not x.is_cuda, num_warps=warps, num_stages=stages, launch_pdl=pdl,
    )  # fmt: skip
    return out


# NOTE: one ``torch.ops.graphrt`` op per launch, so the emulated capture engine records it.
_LIB = torch.library.Library("graphrt", "FRAGMENT")
_LIB.define("fp8_gemm(Tensor x, Tensor q, Tensor scale, Tensor? bias, int[] tile, bool pdl) -> Tensor")
_LIB.impl("fp8_gemm", _fp8_gemm, "CompositeExplicitAutograd")


if triton is not None:

    @triton.jit
    def _mac8(acc, tile, xt, BLOCK_M: tl.constexpr, F32_DOT: tl.constexpr):
        """``acc + xt @ tile^T`` with ``tile`` in e4m3: widened exactly (to fp32, or x's dtype)."""
        if BLOCK_M == 1:
            return acc + tl.sum(tile.to(tl.float32) * xt.to(tl.float32), axis=1)
        elif F32_DOT:  # NOTE: Triton's interpreter multiplies bf16 as raw uint16 bits
            return tl.dot(xt.to(tl.float32), tl.trans(tile.to(tl.float32)), acc, input_precision="ieee")
        else:  # NOTE: every e4m3 value is exact in bf16 and fp16
            return tl.dot(xt, tl.trans(tile.to(xt.dtype)), acc)

    @triton.jit
    def _fp8_skinny(
        x, w, scale, bias, y, M, N, K, x_stride, w_stride,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
        HAS_BIAS: tl.constexpr, PDL: tl.constexpr, F32_DOT: tl.constexpr,
    ):  # fmt: skip
        rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
        rk = tl.arange(0, BLOCK_K)
        rm = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
        w_rows = w + rn.to(tl.int64) * w_stride
        s = tl.load(scale + rn, mask=rn < N, other=0.0)
        if HAS_BIAS:
            b = tl.load(bias + rn, mask=rn < N, other=0.0).to(tl.float32)
        acc = tl.zeros((BLOCK_N,) if BLOCK_M == 1 else (BLOCK_M, BLOCK_N), dtype=tl.float32)
        tile = skinny.w_tile(w_rows, rn, 0, rk, N, K)  # NOTE: weights only: before the wait
        if PDL:
            tl.extra.cuda.gdc_wait()  # NOTE: x is the previous kernel's output
            tl.extra.cuda.gdc_launch_dependents()
        for k0 in range(0, K, BLOCK_K):
            xt = skinny.x_tile(x, rm, k0 + rk, M, K, x_stride)
            ahead = skinny.w_tile(w_rows, rn, k0 + BLOCK_K, rk, N, K)
            acc = _mac8(acc, tile, xt, BLOCK_M, F32_DOT)
            tile = ahead
        out = (acc * s)[None, :] if BLOCK_M == 1 else acc * s[None, :]
        if HAS_BIAS:
            out += b[None, :]
        mask = (rm[:, None] < M) & (rn[None, :] < N)
        tl.store(y + rm[:, None] * N + rn[None, :], out.to(y.dtype.element_ty), mask=mask)
