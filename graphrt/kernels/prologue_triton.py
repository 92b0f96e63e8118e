"""Triton kernels of the fused prologues (launched by :mod:`graphrt.kernels.prologue`).

Three entry points, named so a graph's kernel table shows them: ``prologue_norm_gemm`` (RMSNorm,
optionally after the residual add, then the GEMM), ``prologue_norm_keep_gemm`` (the same, program
0 also writing the normed row for the layer's other consumers) and ``prologue_silu_gemm``
(SiLU-and-mul, then the GEMM). All three are the single-row skinny GEMM of
:mod:`graphrt.kernels.skinny` (one program per ``BLOCK_N`` rows of ``W``, the next ``W`` tile
loaded ahead, fp32 products summed per tile) whose input vector is computed while it is loaded.
Empty without Triton (CI's CPU torch has none).
"""

from __future__ import annotations

from graphrt.kernels.switches import tl, triton

if triton is not None:
    from graphrt.kernels.skinny import w_tile

    @triton.jit
    def _rne(v, BF16: tl.constexpr):
        """``v`` rounded to the activation dtype, to nearest with ties to even, kept in fp32."""
        if BF16:  # NOTE: by hand: Triton's interpreter truncates a cast to bf16
            bits = v.to(tl.uint32, bitcast=True)
            bits = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16
            out = tl.where(v == v, bits.to(tl.float32, bitcast=True), v)  # NOTE: NaN stays NaN
        else:
            out = v.to(tl.float16).to(tl.float32)
        return out

    @triton.jit
    def _stream(x, res, cols, K, ADD: tl.constexpr, BF16: tl.constexpr):
        """The residual stream ``h`` at ``cols`` in fp32 (zero past ``K``): ``x``, or ``res + x``
        rounded once as torch's 16-bit add rounds it."""
        h = tl.load(x + cols, mask=cols < K, other=0.0).to(tl.float32)
        if ADD:
            h = _rne(h + tl.load(res + cols, mask=cols < K, other=0.0).to(tl.float32), BF16)
        return h

    @triton.jit
    def _keep(new, h, cols, K):
        """Program 0 writes ``h`` at ``cols`` to ``new``: no program of this launch reads it, so
        the others need no barrier."""
        stored = tl.where(tl.program_id(0) == 0, K, 0)
        tl.store(new + cols, h.to(new.dtype.element_ty), mask=cols < stored)

    @triton.jit
    def _normed(h, inv_rms, nw, cols, K, BF16: tl.constexpr):
        """``h * inv_rms * norm weight``, rounded as ``ops.rms_norm_ref`` rounds it."""
        return _rne(h * inv_rms * tl.load(nw + cols, mask=cols < K, other=0.0).to(tl.float32), BF16)

    @triton.jit
    def _gated(gate_up, cols, K, BF16: tl.constexpr):
        """``silu(g) * u`` at ``cols``, rounded as ``ops.silu_and_mul_ref`` rounds it."""
        g = tl.load(gate_up + cols, mask=cols < K, other=0.0).to(tl.float32)
        u = tl.load(gate_up + K + cols, mask=cols < K, other=0.0).to(tl.float32)
        return _rne(g / (1.0 + tl.exp(-g)) * u, BF16)

    @triton.jit
    def _inv_rms(x, res, new, K, eps, BLOCK_K: tl.constexpr, ADD: tl.constexpr, BF16: tl.constexpr):
        """``rsqrt(mean(h^2) + eps)`` over all of ``h`` (a first pass); program 0 keeps ``h``."""
        rk = tl.arange(0, BLOCK_K)
        squares = tl.zeros((BLOCK_K,), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            h = _stream(x, res, k0 + rk, K, ADD, BF16)
            _keep(new, h, k0 + rk, K)
            squares += h * h
        return tl.math.rsqrt(tl.sum(squares, axis=0) / K + eps)

    @triton.jit
    def _whole_input(
        x, res, nw, new, rk, K, eps, SILU_MUL: tl.constexpr, ADD: tl.constexpr, BF16: tl.constexpr
    ):
        """The GEMM's whole input when ``K <= BLOCK_K``: ``x`` (and ``res``) read once."""
        if SILU_MUL:
            a = _gated(x, rk, K, BF16)
        else:
            h = _stream(x, res, rk, K, ADD, BF16)
            _keep(new, h, rk, K)
            a = _normed(h, tl.math.rsqrt(tl.sum(h * h, axis=0) / K + eps), nw, rk, K, BF16)
        return a

    @triton.jit
    def _prologue_gemm(
        x, res, nw, w, bias, y, new, normed, N, K, w_stride, eps,
        BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SILU_MUL: tl.constexpr, ADD: tl.constexpr,
        HAS_BIAS: tl.constexpr, BF16: tl.constexpr, PDL: tl.constexpr, ONE_TILE: tl.constexpr,
        KEEP_NORMED: tl.constexpr, WIDE: tl.constexpr,
    ):  # fmt: skip
        """The shared body. ``KEEP_NORMED``: program 0 also writes the rounded GEMM input (the
        normed row) to ``normed``. ``WIDE``: a float32 ``W`` (and bias) and output, the fp32 sum
        stored unrounded (the skinny GEMM's float32 router)."""
        rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
        rk = tl.arange(0, BLOCK_K)
        w_rows = w + rn.to(tl.int64) * w_stride
        tile = w_tile(w_rows, rn, 0, rk, N, K)  # NOTE: weights only: before the wait
        if HAS_BIAS:
            b = tl.load(bias + rn, mask=rn < N, other=0.0).to(tl.float32)
        if PDL:
            tl.extra.cuda.gdc_wait()  # NOTE: x and the residual are earlier kernels' outputs
            tl.extra.cuda.gdc_launch_dependents()
        if ONE_TILE:  # NOTE: K <= BLOCK_K (every hidden size up to 2048): the tile is all of W's rows
            a = _whole_input(x, res, nw, new, rk, K, eps, SILU_MUL, ADD, BF16)
            if KEEP_NORMED:
                _keep(normed, a, rk, K)
            acc = tl.sum(tile.to(tl.float32) * a[None, :], axis=1)
        else:  # NOTE: the norm needs all of h first: a pass for it, then one per K tile
            acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
            if not SILU_MUL:
                inv_rms = _inv_rms(x, res, new, K, eps, BLOCK_K, ADD, BF16)
            for k0 in range(0, K, BLOCK_K):
                if SILU_MUL:
                    a = _gated(x, k0 + rk, K, BF16)
                else:
                    a = _normed(_stream(x, res, k0 + rk, K, ADD, BF16), inv_rms, nw, k0 + rk, K, BF16)
                    if KEEP_NORMED:
                        _keep(normed, a, k0 + rk, K)
                ahead = w_tile(w_rows, rn, k0 + BLOCK_K, rk, N, K)  # NOTE: empty mask on the last step
                acc += tl.sum(tile.to(tl.float32) * a[None, :], axis=1)
                tile = ahead
        if HAS_BIAS:
            acc += b
        if not WIDE:  # NOTE: a float32 output keeps the fp32 sum, as F.linear(x.float(), W) does
            acc = _rne(acc, BF16)
        tl.store(y + rn, acc.to(y.dtype.element_ty), mask=rn < N)

    @triton.jit
    def prologue_norm_gemm(
        x, res, nw, w, bias, y, new, N, K, w_stride, eps,
        BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, ADD: tl.constexpr, HAS_BIAS: tl.constexpr,
        BF16: tl.constexpr, PDL: tl.constexpr, ONE_TILE: tl.constexpr,
    ):  # fmt: skip
        """``y = rms_norm(h) @ W^T (+ b)``, ``h = x`` or ``res + x``; program 0 writes ``h`` to ``new``."""
        _prologue_gemm(
            x, res, nw, w, bias, y, new, new, N, K, w_stride, eps,
            BLOCK_N, BLOCK_K, False, ADD, HAS_BIAS, BF16, PDL, ONE_TILE, False, False,
        )  # fmt: skip

    @triton.jit
    def prologue_norm_keep_gemm(
        x, res, nw, w, bias, y, new, normed, N, K, w_stride, eps,
        BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, ADD: tl.constexpr, HAS_BIAS: tl.constexpr,
        BF16: tl.constexpr, PDL: tl.constexpr, ONE_TILE: tl.constexpr, WIDE: tl.constexpr,
    ):  # fmt: skip
        """:func:`prologue_norm_gemm`, program 0 also writing ``rms_norm(h)`` to ``normed``;
        ``WIDE``: float32 ``W``, bias and ``y``."""
        _prologue_gemm(
            x, res, nw, w, bias, y, new, normed, N, K, w_stride, eps,
            BLOCK_N, BLOCK_K, False, ADD, HAS_BIAS, BF16, PDL, ONE_TILE, True, WIDE,
        )  # fmt: skip

    @triton.jit
    def prologue_silu_gemm(
        gate_up, w, bias, y, N, K, w_stride,
        BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, HAS_BIAS: tl.constexpr, BF16: tl.constexpr,
        PDL: tl.constexpr, ONE_TILE: tl.constexpr,
    ):  # fmt: skip
        """``y = (silu(g) * u) @ W^T (+ b)`` of ``gate_up = [g | u]`` (``K`` each)."""
        _prologue_gemm(
            gate_up, gate_up, w, w, bias, y, y, y, N, K, w_stride, 0.0,
            BLOCK_N, BLOCK_K, True, False, HAS_BIAS, BF16, PDL, ONE_TILE, False, False,
        )  # fmt: skip
