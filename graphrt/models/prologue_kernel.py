"""Triton kernels of the fused prologues (launched by :mod:`graphrt.models.prologue`).

Two entry points, named so a graph's kernel table shows them: ``prologue_norm_gemm`` (RMSNorm,
optionally after the residual add, then the GEMM) and ``prologue_silu_gemm`` (SiLU-and-mul, then
the GEMM). Both are the single-row skinny GEMM of :mod:`graphrt.models.skinny` (one program per
``BLOCK_N`` rows of ``W``, the next ``W`` tile loaded ahead, fp32 products summed per tile) whose
input vector is computed while it is loaded. Empty without Triton (CI's CPU torch has none).
"""

from __future__ import annotations

from graphrt.step.switches import tl, triton

if triton is not None:
    from graphrt.models.skinny import w_tile

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
        stored = tl.where(tl.program_id(0) == 0, K, 0)  # NOTE: program 0 alone writes ``new``
        squares = tl.zeros((BLOCK_K,), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            h = _stream(x, res, k0 + rk, K, ADD, BF16)
            # NOTE: no program of this launch reads ``new``: the others need no barrier
            tl.store(new + k0 + rk, h.to(new.dtype.element_ty), mask=k0 + rk < stored)
            squares += h * h
        return tl.math.rsqrt(tl.sum(squares, axis=0) / K + eps)

    @triton.jit
    def _input(x, res, nw, cols, K, inv_rms, SILU_MUL: tl.constexpr, ADD: tl.constexpr, BF16: tl.constexpr):
        """The GEMM's input at ``cols`` in fp32, rounded where the torch ops round it (zero past ``K``)."""
        if SILU_MUL:
            g = tl.load(x + cols, mask=cols < K, other=0.0).to(tl.float32)
            u = tl.load(x + K + cols, mask=cols < K, other=0.0).to(tl.float32)
            return _rne(g / (1.0 + tl.exp(-g)) * u, BF16)
        h = _stream(x, res, cols, K, ADD, BF16)
        weight = tl.load(nw + cols, mask=cols < K, other=0.0).to(tl.float32)
        return _rne(h * inv_rms * weight, BF16)

    @triton.jit
    def _prologue_gemm(
        x, res, nw, w, bias, y, new, N, K, w_stride, eps,
        BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SILU_MUL: tl.constexpr, ADD: tl.constexpr,
        HAS_BIAS: tl.constexpr, BF16: tl.constexpr, PDL: tl.constexpr, ONE_TILE: tl.constexpr,
    ):  # fmt: skip
        rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
        rk = tl.arange(0, BLOCK_K)
        w_rows = w + rn.to(tl.int64) * w_stride
        tile = w_tile(w_rows, rn, 0, rk, N, K)  # NOTE: weights only: before the wait
        if HAS_BIAS:
            b = tl.load(bias + rn, mask=rn < N, other=0.0).to(tl.float32)
        if PDL:
            tl.extra.cuda.gdc_wait()  # NOTE: x and the residual are earlier kernels' outputs
            tl.extra.cuda.gdc_launch_dependents()
        if SILU_MUL:  # noqa: SIM108 - a compile-time branch: only one side is ever built
            inv_rms = 1.0
        else:
            inv_rms = _inv_rms(x, res, new, K, eps, BLOCK_K, ADD, BF16)
        if ONE_TILE:  # NOTE: no tile ahead to hold: K <= BLOCK_K (every hidden size up to 2048)
            a = _input(x, res, nw, rk, K, inv_rms, SILU_MUL, ADD, BF16)
            acc = tl.sum(tile.to(tl.float32) * a[None, :], axis=1)
        else:
            acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
            for k0 in range(0, K, BLOCK_K):
                a = _input(x, res, nw, k0 + rk, K, inv_rms, SILU_MUL, ADD, BF16)
                ahead = w_tile(w_rows, rn, k0 + BLOCK_K, rk, N, K)  # NOTE: empty mask on the last step
                acc += tl.sum(tile.to(tl.float32) * a[None, :], axis=1)
                tile = ahead
        if HAS_BIAS:
            acc += b
        tl.store(y + rn, _rne(acc, BF16).to(y.dtype.element_ty), mask=rn < N)

    @triton.jit
    def prologue_norm_gemm(
        x, res, nw, w, bias, y, new, N, K, w_stride, eps,
        BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, ADD: tl.constexpr, HAS_BIAS: tl.constexpr,
        BF16: tl.constexpr, PDL: tl.constexpr, ONE_TILE: tl.constexpr,
    ):  # fmt: skip
        """``y = rms_norm(h) @ W^T (+ b)``, ``h = x`` or ``res + x``; program 0 writes ``h`` to ``new``."""
        _prologue_gemm(
            x, res, nw, w, bias, y, new, N, K, w_stride, eps,
            BLOCK_N, BLOCK_K, False, ADD, HAS_BIAS, BF16, PDL, ONE_TILE,
        )  # fmt: skip

    @triton.jit
    def prologue_silu_gemm(
        gate_up, w, bias, y, N, K, w_stride,
        BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, HAS_BIAS: tl.constexpr, BF16: tl.constexpr,
        PDL: tl.constexpr, ONE_TILE: tl.constexpr,
    ):  # fmt: skip
        """``y = (silu(g) * u) @ W^T (+ b)`` of ``gate_up = [g | u]`` (``K`` each)."""
        _prologue_gemm(
            gate_up, gate_up, w, w, bias, y, y, N, K, w_stride, 0.0,
            BLOCK_N, BLOCK_K, True, False, HAS_BIAS, BF16, PDL, ONE_TILE,
        )  # fmt: skip
