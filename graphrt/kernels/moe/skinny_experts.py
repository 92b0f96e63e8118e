"""The skinny expert path: a few token slots (bs 1-4), each reading only its own expert's weights.

At small ``T * k`` a grouped GEMM's blocks are almost all padding, and the alignment costs a
launch; these kernels read ``topk_ids`` directly (no alignment) and stream weights GEMV-style,
as :mod:`graphrt.kernels.skinny` does for dense ``M == 1``: fp32 products summed per row, one
weight tile loaded ahead of the one being multiplied.

- :func:`_skinny_up`: one program per (slot, ``block_n`` columns of ``I``): gate and up rows of
  the slot's expert times ``x[t]``, the activation fused, into ``inter [T * k, I]``. A pad slot
  (id ``E``) returns before loading any weight.
- :func:`_skinny_down`: one program per (token, ``block_n`` columns of ``H``, part) walks its
  part of the token's ``k`` slots in order, ``sum_j weight_j * (inter[t k + j] @ w2[e_j]^T +
  b2[e_j])``: the weighted sum fused, one fixed order (deterministic). With one part it writes
  ``out [T, H]``; with ``S`` parts (the table's ``skinny_down_split``: at bs 1 one program per
  column tile leaves too few loads in flight to stream ``w2``) each part writes fp32 partial sums
  ``[S, T, H]`` that :func:`_sum_parts` adds in part order. Its first weight tile is loaded before
  the PDL wait: ``topk_ids`` was written before the previous kernel (which waited on it) let this
  one start.
"""

from __future__ import annotations

from graphrt.kernels.moe.grouped import activate
from graphrt.kernels.switches import tl, triton

if triton is not None:

    @triton.jit
    def _gate_up_tile(w13, expert, rn, k0, rk, H, INTER, ok):
        """Gate and up rows ``rn`` of ``expert`` at columns ``k0 + rk`` (zeros where masked)."""
        rows = w13 + expert.to(tl.int64) * 2 * INTER * H + rn.to(tl.int64) * H
        cols = k0 + rk
        mask = ok & (rn[:, None] < INTER) & (cols[None, :] < H)
        g = tl.load(rows[:, None] + cols[None, :], mask=mask, other=0.0)
        u = tl.load(rows[:, None] + INTER * H + cols[None, :], mask=mask, other=0.0)
        return g, u

    @triton.jit
    def _skinny_up(
        x, w13, b13, inter, topk_ids, E, H, INTER, TOPK, x_stride,
        BN: tl.constexpr, BK: tl.constexpr, ACT: tl.constexpr, HAS_BIAS: tl.constexpr,
        PDL: tl.constexpr,
    ):  # fmt: skip
        if PDL:
            tl.extra.cuda.gdc_wait()  # NOTE: topk_ids (the router's) and x (the layer's input)
            tl.extra.cuda.gdc_launch_dependents()
        slot = tl.program_id(0)
        expert = tl.load(topk_ids + slot)
        if expert < E:
            rn = tl.program_id(1) * BN + tl.arange(0, BN)
            rk = tl.arange(0, BK)
            x_row = x + (slot // TOPK).to(tl.int64) * x_stride
            acc_g = tl.zeros((BN,), dtype=tl.float32)
            acc_u = tl.zeros((BN,), dtype=tl.float32)
            g, u = _gate_up_tile(w13, expert, rn, 0, rk, H, INTER, True)
            for k0 in range(0, H, BK):
                xt = tl.load(x_row + k0 + rk, mask=k0 + rk < H, other=0.0).to(tl.float32)
                g_next, u_next = _gate_up_tile(w13, expert, rn, k0 + BK, rk, H, INTER, True)
                acc_g += tl.sum(g.to(tl.float32) * xt[None, :], axis=1)
                acc_u += tl.sum(u.to(tl.float32) * xt[None, :], axis=1)
                g, u = g_next, u_next
            if HAS_BIAS:
                b_rows = b13 + expert * 2 * INTER + rn
                acc_g += tl.load(b_rows, mask=rn < INTER, other=0.0).to(tl.float32)
                acc_u += tl.load(b_rows + INTER, mask=rn < INTER, other=0.0).to(tl.float32)
            h = activate(acc_g, acc_u, ACT)
            tl.store(inter + slot.to(tl.int64) * INTER + rn, h.to(inter.dtype.element_ty), mask=rn < INTER)

    @triton.jit
    def _down_tile(w2, topk_ids, t, j0, q, NK, COUNT, TOPK, E, rn, rk, H, INTER, BK: tl.constexpr):
        """Step ``q`` of a part's walk over slots ``j0 ..< j0 + COUNT`` (slot ``j0 + q // NK``,
        column tile ``q % NK``): its ``w2`` tile, zeros for a pad slot or past the last step."""
        j = j0 + q // NK
        k0 = (q % NK) * BK
        in_walk = q < NK * COUNT
        expert = tl.load(topk_ids + t * TOPK + j, mask=in_walk, other=E)
        ok = expert < E
        rows = w2 + tl.where(ok, expert, 0).to(tl.int64) * H * INTER + rn.to(tl.int64) * INTER
        cols = k0 + rk
        mask = ok & (rn[:, None] < H) & (cols[None, :] < INTER)
        return tl.load(rows[:, None] + cols[None, :], mask=mask, other=0.0)

    @triton.jit
    def _skinny_down(
        inter, w2, b2, topk_ids, topk_weights, out, E, H, INTER, TOPK, NK,
        BN: tl.constexpr, BK: tl.constexpr, SPLIT: tl.constexpr, HAS_BIAS: tl.constexpr,
        PDL: tl.constexpr,
    ):  # fmt: skip
        t = tl.program_id(0)
        rn = tl.program_id(1) * BN + tl.arange(0, BN)
        rk = tl.arange(0, BK)
        per = tl.cdiv(TOPK, SPLIT)
        j0 = tl.program_id(2) * per
        count = tl.minimum(per, TOPK - j0)
        tile = _down_tile(
            w2, topk_ids, t, j0, 0, NK, count, TOPK, E, rn, rk, H, INTER, BK
        )  # NOTE: before the wait
        if PDL:
            tl.extra.cuda.gdc_wait()  # NOTE: inter is the previous kernel's output
            tl.extra.cuda.gdc_launch_dependents()
        acc = tl.zeros((BN,), dtype=tl.float32)
        total = tl.zeros((BN,), dtype=tl.float32)
        for q in range(0, NK * count):
            slot = t * TOPK + j0 + q // NK
            k0 = (q % NK) * BK
            expert = tl.load(topk_ids + slot)
            ok = expert < E
            ahead = _down_tile(w2, topk_ids, t, j0, q + 1, NK, count, TOPK, E, rn, rk, H, INTER, BK)
            h = tl.load(inter + slot.to(tl.int64) * INTER + k0 + rk, mask=ok & (k0 + rk < INTER), other=0.0)
            acc += tl.sum(tile.to(tl.float32) * h.to(tl.float32)[None, :], axis=1)
            if q % NK == NK - 1:
                if HAS_BIAS:
                    b_row = b2 + tl.where(ok, expert, 0) * H + rn
                    acc += tl.load(b_row, mask=ok & (rn < H), other=0.0).to(tl.float32)
                weight = tl.load(topk_weights + slot).to(tl.float32)
                total += tl.where(ok, weight, 0.0) * acc
                acc = tl.zeros((BN,), dtype=tl.float32)
            tile = ahead
        row = (tl.program_id(2) * tl.num_programs(0) + t).to(tl.int64) * H  # NOTE: part-major partials
        tl.store(out + row + rn, total.to(out.dtype.element_ty), mask=rn < H)

    @triton.jit
    def _sum_parts(parts, out, N, SPLIT: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr):
        """``out[i] = sum_s parts[s, i]`` over ``N`` entries, parts added in order (deterministic)."""
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        if PDL:
            tl.extra.cuda.gdc_wait()  # NOTE: the parts are the down kernel's output
            tl.extra.cuda.gdc_launch_dependents()
        total = tl.load(parts + i, mask=i < N, other=0.0)
        for s in range(1, SPLIT):
            total += tl.load(parts + s * N + i, mask=i < N, other=0.0)
        tl.store(out + i, total.to(out.dtype.element_ty), mask=i < N)
