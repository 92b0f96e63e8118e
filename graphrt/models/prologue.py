"""The skinny GEMM with its input's last op fused in: one launch where the unfused path has two.

A single-row decode step runs ~9 kernels per layer, each a few µs however small; the norms and
the SwiGLU activation read and write a few KB. Here the single-row (``M == 1``) skinny GEMM of
:mod:`graphrt.models.skinny` computes its own input while it loads it (the *prologue*):

- :func:`norm_linear`: ``rms_norm(h) @ W^T (+ b)`` with ``h = x``, or ``h = residual + x`` (the
  fused add + norm; the new residual stream comes back as a new tensor). The reduction over the
  hidden size is tiny (576-4096 values), so every program computes ``rsqrt(mean(h^2) + eps)``
  itself in a first pass over ``h``; program 0 alone writes ``h`` (the new residual) to a buffer
  no program of the launch reads.
- :func:`silu_mul_linear`: ``(silu(g) * u) @ W^T (+ b)`` of ``gate_up = [g | u]`` (gate first).

The activation is computed in fp32 and rounded to the activation dtype exactly where the unfused
torch ops round it (the sum ``residual + x``, the normed ``h``, the product ``silu(g) * u``;
:func:`graphrt.models.ops.rms_norm_ref`, :func:`~graphrt.models.ops.silu_and_mul_ref`), then
multiplied as the skinny GEMM multiplies: fp32 products, fp32 sums in the same order, the bias
added in fp32, one rounding. Rounding to bf16 is done by hand (to nearest, ties to even): Triton's
interpreter truncates a cast to bf16. PDL as the skinny GEMM: weights and bias before
``gdc_wait()``, every input after it.

``GRAPHRT_FUSED_PROLOGUE`` (:mod:`graphrt.step.switches`) switches the fused kernels;
``GRAPHRT_SKINNY_GEMM=0`` turns them off too (they are the skinny GEMM).
"""

from __future__ import annotations

import torch

from graphrt.models import skinny
from graphrt.step.switches import tl, triton, triton_enabled

ENV = "GRAPHRT_FUSED_PROLOGUE"


def enabled(device: torch.device) -> bool:
    """Whether the fused kernels run for tensors on ``device`` (:data:`ENV` and the skinny GEMM's switch)."""
    return triton_enabled(ENV, device) and skinny.enabled(device)


def _norm_problem(
    x: torch.Tensor, residual: torch.Tensor | None, norm_weight: torch.Tensor, weight: torch.Tensor,
    bias: torch.Tensor | None,
) -> str | None:  # fmt: skip
    problem = _one_row(x) or skinny.problem(x, weight, bias)
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


def _silu_problem(gate_up: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> str | None:
    problem = _one_row(gate_up)
    if problem is None and (weight.dim() != 2 or gate_up.shape[1] != 2 * weight.shape[1]):
        problem = f"gate_up {tuple(gate_up.shape)} is not [1, 2 K] for weight {tuple(weight.shape)} [N, K]"
    return problem or skinny.problem(gate_up[:, : weight.shape[1]], weight, bias)


def _one_row(x: torch.Tensor) -> str | None:
    return None if x.dim() == 2 and x.shape[0] == 1 else f"x {tuple(x.shape)} is not one row [1, K]"


def fits_norm(
    x: torch.Tensor, residual: torch.Tensor | None, norm_weight: torch.Tensor, weight: torch.Tensor,
    bias: torch.Tensor | None = None,
) -> bool:  # fmt: skip
    """Whether :func:`norm_linear` takes these tensors (else it raises saying why)."""
    return _norm_problem(x, residual, norm_weight, weight, bias) is None


def fits_silu(gate_up: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> bool:
    """Whether :func:`silu_mul_linear` takes these tensors (else it raises saying why)."""
    return _silu_problem(gate_up, weight, bias) is None


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
    weight, bias, tile, pdl : as :func:`graphrt.models.skinny.skinny_linear`.

    Returns
    -------
    ``(y [1, N], h [1, K])``, both in ``x``'s dtype. ``h`` is ``x`` itself when ``residual`` is
    None, else a new tensor (``residual + x`` rounded once); no input is written.
    """
    problem = _norm_problem(x, residual, norm_weight, weight, bias)
    if problem is not None:
        raise ValueError(f"fused norm + GEMM: {problem}")
    new = x if residual is None else torch.empty_like(x)
    src = x if residual is None else residual
    out = _launch(
        x, src, norm_weight, weight, bias, new, eps, tile, pdl, silu=False, add=residual is not None
    )
    return out, new


def silu_mul_linear(
    gate_up: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *,
    tile: skinny.Tile | None = None, pdl: bool | None = None,
) -> torch.Tensor:  # fmt: skip
    """``(silu(gate) * up) @ weight^T (+ bias)`` of ``gate_up [1, 2 K] = [gate | up]``: ``[1, N]``.

    ``weight [N, K]`` and ``bias [N]`` in ``gate_up``'s dtype (bf16 or fp16), unit stride along
    ``K``; ``tile`` and ``pdl`` as :func:`graphrt.models.skinny.skinny_linear`.
    """
    problem = _silu_problem(gate_up, weight, bias)
    if problem is not None:
        raise ValueError(f"fused SiLU-and-mul + GEMM: {problem}")
    return _launch(gate_up, gate_up, weight, weight, bias, gate_up, 0.0, tile, pdl, silu=True, add=False)


def _launch(
    x: torch.Tensor, residual: torch.Tensor, norm_weight: torch.Tensor, weight: torch.Tensor,
    bias: torch.Tensor | None, new: torch.Tensor, eps: float, tile: skinny.Tile | None, pdl: bool | None,
    *, silu: bool, add: bool,
) -> torch.Tensor:  # fmt: skip
    n, k = weight.shape
    tile = skinny.tile_for(1, n, k) if tile is None else tile.fit(1, n, k)
    pdl = skinny.pdl_default(x.device) if pdl is None else pdl
    out = torch.empty((1, n), dtype=x.dtype, device=x.device)
    _prologue_gemm[(triton.cdiv(n, tile.block_n),)](
        x, residual, norm_weight, weight, weight if bias is None else bias, out, new, n, k, weight.stride(0),
        eps, BLOCK_N=tile.block_n, BLOCK_K=tile.block_k, SILU_MUL=silu, ADD=add, HAS_BIAS=bias is not None,
        BF16=x.dtype == torch.bfloat16, PDL=pdl, ONE_TILE=k <= tile.block_k, num_warps=tile.warps,
        num_stages=tile.stages, launch_pdl=pdl,
    )  # fmt: skip
    return out


if triton is not None:

    @triton.jit
    def _rne(v, BF16: tl.constexpr):
        """``v`` rounded to the activation dtype, to nearest with ties to even, kept in fp32."""
        if BF16:  # NOTE: by hand: Triton's interpreter truncates a cast to bf16
            bits = v.to(tl.uint32, bitcast=True)
            bits = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16
            return tl.where(v == v, bits.to(tl.float32, bitcast=True), v)  # NOTE: NaN stays NaN
        return v.to(tl.float16).to(tl.float32)

    @triton.jit
    def _stream(x, res, cols, K, ADD: tl.constexpr, BF16: tl.constexpr):
        """The residual stream ``h`` at ``cols`` in fp32 (zero past ``K``): ``x``, or ``res + x``
        rounded once as torch's 16-bit add rounds it."""
        h = tl.load(x + cols, mask=cols < K, other=0.0).to(tl.float32)
        if ADD:
            h = _rne(h + tl.load(res + cols, mask=cols < K, other=0.0).to(tl.float32), BF16)
        return h

    @triton.jit
    def _inv_rms(x, res, new, K, eps, BLOCK_K: tl.constexpr, ADD: tl.constexpr, BF16: tl.constexpr):
        """``rsqrt(mean(h^2) + eps)`` over all of ``h``; program 0 writes ``h`` to ``new``."""
        rk = tl.arange(0, BLOCK_K)
        squares = tl.zeros((BLOCK_K,), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            h = _stream(x, res, k0 + rk, K, ADD, BF16)
            if ADD:  # noqa: SIM102 - a compile-time branch around a runtime one
                if tl.program_id(0) == 0:  # NOTE: no program of this launch reads ``new``
                    tl.store(new + k0 + rk, h.to(new.dtype.element_ty), mask=k0 + rk < K)
            squares += h * h
        return tl.math.rsqrt(tl.sum(squares, axis=0) / K + eps)

    @triton.jit
    def _input(x, res, nw, cols, K, inv_rms, SILU_MUL: tl.constexpr, ADD: tl.constexpr, BF16: tl.constexpr):
        """The GEMM's input at ``cols`` in fp32, rounded to the activation dtype (zero past ``K``)."""
        if SILU_MUL:
            g = tl.load(x + cols, mask=cols < K, other=0.0).to(tl.float32)
            u = tl.load(x + K + cols, mask=cols < K, other=0.0).to(tl.float32)
            return _rne(g / (1.0 + tl.exp(-g)) * u, BF16)
        h = _stream(x, res, cols, K, ADD, BF16)
        return _rne(h * inv_rms * tl.load(nw + cols, mask=cols < K, other=0.0).to(tl.float32), BF16)

    @triton.jit
    def _prologue_gemm(
        x, res, nw, w, bias, y, new, N, K, w_stride, eps,
        BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SILU_MUL: tl.constexpr, ADD: tl.constexpr,
        HAS_BIAS: tl.constexpr, BF16: tl.constexpr, PDL: tl.constexpr, ONE_TILE: tl.constexpr,
    ):  # fmt: skip
        rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
        rk = tl.arange(0, BLOCK_K)
        w_rows = w + rn.to(tl.int64) * w_stride
        tile = skinny.w_tile(w_rows, rn, 0, rk, N, K)  # NOTE: weights only: before the wait
        if HAS_BIAS:
            b = tl.load(bias + rn, mask=rn < N, other=0.0).to(tl.float32)
        if PDL:
            tl.extra.cuda.gdc_wait()  # NOTE: x and the residual are earlier kernels' outputs
            tl.extra.cuda.gdc_launch_dependents()
        inv_rms = 1.0
        if not SILU_MUL:
            inv_rms = _inv_rms(x, res, new, K, eps, BLOCK_K, ADD, BF16)
        if ONE_TILE:  # NOTE: no tile ahead to hold: K <= BLOCK_K (every hidden size up to 2048)
            acc = tl.sum(
                tile.to(tl.float32) * _input(x, res, nw, rk, K, inv_rms, SILU_MUL, ADD, BF16)[None, :], axis=1
            )
        else:
            acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
            for k0 in range(0, K, BLOCK_K):
                a = _input(x, res, nw, k0 + rk, K, inv_rms, SILU_MUL, ADD, BF16)
                ahead = skinny.w_tile(w_rows, rn, k0 + BLOCK_K, rk, N, K)  # NOTE: empty mask on the last step
                acc += tl.sum(tile.to(tl.float32) * a[None, :], axis=1)
                tile = ahead
        if HAS_BIAS:
            acc += b
        tl.store(y + rn, _rne(acc, BF16).to(y.dtype.element_ty), mask=rn < N)
