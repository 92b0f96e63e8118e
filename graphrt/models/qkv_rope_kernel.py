"""Triton kernel of the qkv projection with RoPE and the KV store in its epilogue (``qkv_rope_gemm``).

The norm prologue GEMM (``prologue_weights`` then ``prologue_sum`` of
:mod:`graphrt.models.prologue_kernel`: one program per 8 rows of ``W``, the same tile) whose
programs take rows a rotation pairs: RoPE (NeoX halves) mixes output column ``i`` of a head with
``i + D/2``, so a program over the q and k heads takes 4 consecutive ``i`` of one head and their 4
partners (rows ``h D + i0 + j`` and ``h D + D/2 + i0 + j``, ``j < 4``); a program over the v
heads takes 8 consecutive rows. Row indices are computed, rows stay contiguous along ``K``: no
weight is copied or permuted. Empty without Triton.

PDL: the weight tile (and bias) before ``gdc_wait()``; the stream, ``cos_sin`` and the slot after
it (the cos/sin kernel runs right before layer 0 and lets its dependents start before it writes).
"""

from __future__ import annotations

from graphrt.step.switches import tl, triton

if triton is not None:
    from graphrt.kv.rope_store import rotate_halves
    from graphrt.models.prologue_kernel import _rne, prologue_sum, prologue_weights

    @triton.jit
    def _rows(p, HQ: tl.constexpr, HK: tl.constexpr, HALF: tl.constexpr):
        """The 8 rows of ``W`` program ``p`` sums: a rotated quad and its partners, or 8 v rows."""
        quads: tl.constexpr = HALF // 4
        j = tl.arange(0, 8)
        rotated = (p // quads) * (2 * HALF) + (p % quads) * 4 + (j % 4) + (j // 4) * HALF
        plain = (HQ + HK) * (2 * HALF) + (p - (HQ + HK) * quads) * 8 + j
        return tl.where(p < (HQ + HK) * quads, rotated, plain)

    @triton.jit
    def _halves(a):
        """``a [8]`` as its first and last 4 values (a quad and its partners)."""
        return tl.split(tl.trans(tl.reshape(a, (2, 4))))

    @triton.jit
    def qkv_rope_gemm(
        x, res, nw, w, bias, q, new, cos_sin, k_cache, v_cache, loc, K, w_stride, eps,
        HQ: tl.constexpr, HK: tl.constexpr, HALF: tl.constexpr, BLOCK_K: tl.constexpr,
        ADD: tl.constexpr, HAS_BIAS: tl.constexpr, BF16: tl.constexpr, PDL: tl.constexpr,
        ONE_TILE: tl.constexpr,
    ):  # fmt: skip
        """``rms_norm(h) @ W^T (+ b)`` of one token, q and k rotated: q to ``q``, k and v to the
        caches' slot ``loc[0]``; program 0 writes ``h`` (``x`` or ``res + x``) to ``new``."""
        p = tl.program_id(0)
        quads: tl.constexpr = HALF // 4
        rn = _rows(p, HQ, HK, HALF)
        n = (HQ + 2 * HK) * 2 * HALF
        rk = tl.arange(0, BLOCK_K)
        w_rows, tile, b = prologue_weights(w, bias, rn, rk, n, K, w_stride, HAS_BIAS)
        if PDL:
            tl.extra.cuda.gdc_wait()  # NOTE: x and the residual are earlier kernels' outputs
            tl.extra.cuda.gdc_launch_dependents()
        acc = prologue_sum(
            x, res, nw, new, w_rows, tile, b, rn, rk, n, K, eps, BLOCK_K, False, ADD, HAS_BIAS, BF16, ONE_TILE
        )
        # NOTE: after the wait, unlike rope_store: the cos/sin kernel runs right before layer 0 and
        # lets its dependents start before it writes. After the sums: live across them, they spill.
        i = (p % quads) * 4 + tl.arange(0, 4)
        cos = tl.load(cos_sin + i).to(tl.float32)
        sin = tl.load(cos_sin + HALF + i).to(tl.float32)
        row = tl.load(loc).to(tl.int64) * (HK * 2 * HALF)  # NOTE: a slot holds every KV head
        a = _rne(acc, BF16)  # NOTE: the unfused GEMM's output, which rope_store reads back
        if p < (HQ + HK) * quads:
            x1, x2 = _halves(a)
            y1, y2 = rotate_halves(x1, x2, cos, sin)  # NOTE: rope_store's expressions: its bits
            lo = (p // quads) * (2 * HALF) + i
            y1, y2 = y1.to(q.dtype.element_ty), y2.to(q.dtype.element_ty)
            if p < HQ * quads:
                tl.store(q + lo, y1)
                tl.store(q + lo + HALF, y2)
            else:
                dst = k_cache + row + (lo - HQ * 2 * HALF)
                tl.store(dst, y1.to(k_cache.dtype.element_ty))
                tl.store(dst + HALF, y2.to(k_cache.dtype.element_ty))
        else:
            tl.store(v_cache + row + (rn - (HQ + HK) * 2 * HALF), a.to(v_cache.dtype.element_ty))
