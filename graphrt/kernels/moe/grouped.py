"""The grouped expert GEMMs over token slots sorted by expert (the field's fused-MoE pattern).

:func:`graphrt.kernels.moe.align.moe_align` groups the ``T * k`` slots by expert into blocks of
:data:`BLOCK_M`; one program multiplies one block (one expert's weights) by ``block_n`` output
columns. The grid is sized for :func:`block_bound`; a program past ``num_padded`` (read on the
device) returns at once, a sentinel slot (``>= T * k``) loads zeros and stores nothing, a block
of expert -1 is skipped.

- :func:`_grouped_up`: ``act(x[t] @ w13[e]^T + b13[e])`` per slot into ``inter [T * k, I]``
  (gate and up tiles of the same columns in one program, the activation fused).
- :func:`_grouped_down`: ``topk_weights[slot] * (inter[slot] @ w2[e]^T + b2[e])`` per slot into
  an fp32 ``[T * k, H]`` buffer; the sum over ``k`` is :func:`graphrt.kernels.moe.triton_experts`'s
  reduction kernel (a fixed order: deterministic for a given routing, no atomics).

Both wait (PDL) before reading routing or activations: each reads a buffer the previous kernel
wrote. Products are fp32 (``tl.dot``), rounded once to the intermediate's dtype.
"""

from __future__ import annotations

from graphrt.kernels.moe import SWIGLU_ALPHA, SWIGLU_LIMIT
from graphrt.kernels.switches import tl, triton

#: ``activation`` name -> the kernels' ``ACT`` constant.
ACT_CODES = {"silu": 0, "swiglu_clamp": 1}

if triton is not None:
    _ALPHA, _LIMIT = tl.constexpr(SWIGLU_ALPHA), tl.constexpr(SWIGLU_LIMIT)

    @triton.jit
    def activate(gate, up, ACT: tl.constexpr):
        """SiLU(gate) * up (``ACT`` 0) or gpt-oss's clamped SwiGLU (``ACT`` 1), in fp32."""
        if ACT == 0:
            return gate * tl.sigmoid(gate) * up
        else:
            gate = tl.minimum(gate, _LIMIT)
            up = tl.minimum(tl.maximum(up, -_LIMIT), _LIMIT)
            return (up + 1.0) * gate * tl.sigmoid(gate * _ALPHA)

    @triton.jit
    def mma(acc, a, b, F32_DOT: tl.constexpr):
        """``acc + a @ b^T`` in fp32 (``F32_DOT``: fp32 operands, IEEE products: fp32 weights,
        and the interpreter, which multiplies bf16 as raw bits)."""
        if F32_DOT:
            return tl.dot(a.to(tl.float32), tl.trans(b.to(tl.float32)), acc, input_precision="ieee")
        else:
            return tl.dot(a, tl.trans(b), acc)

    @triton.jit
    def block_rows(sorted_ids, block_experts, num_padded, S, BM: tl.constexpr):
        """This program's ``(slots [BM], valid [BM], expert, live)``; ``live`` False past the end."""
        pid = tl.program_id(0)
        live = pid * BM < tl.load(num_padded)
        expert = tl.load(block_experts + pid)
        slots = tl.load(sorted_ids + pid * BM + tl.arange(0, BM), mask=live, other=S)
        return slots, slots < S, expert, live & (expert >= 0)

    @triton.jit
    def _grouped_up(
        x, w13, b13, inter, sorted_ids, block_experts, num_padded, S, H, INTER, TOPK, x_stride,
        BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, ACT: tl.constexpr,
        HAS_BIAS: tl.constexpr, PDL: tl.constexpr, F32_DOT: tl.constexpr,
    ):  # fmt: skip
        if PDL:
            tl.extra.cuda.gdc_wait()  # NOTE: routing (the alignment's) and x (the layer's input)
            tl.extra.cuda.gdc_launch_dependents()
        slots, valid, expert, live = block_rows(sorted_ids, block_experts, num_padded, S, BM)
        if live:
            rn = tl.program_id(1) * BN + tl.arange(0, BN)
            rk = tl.arange(0, BK)
            x_rows = x + (slots // TOPK).to(tl.int64) * x_stride
            gate_rows = w13 + expert.to(tl.int64) * 2 * INTER * H + rn.to(tl.int64) * H
            up_rows = gate_rows + INTER * H
            acc_g = tl.zeros((BM, BN), dtype=tl.float32)
            acc_u = tl.zeros((BM, BN), dtype=tl.float32)
            for k0 in range(0, H, BK):
                cols = k0 + rk
                wmask = (rn[:, None] < INTER) & (cols[None, :] < H)
                xt = tl.load(
                    x_rows[:, None] + cols[None, :], mask=valid[:, None] & (cols[None, :] < H), other=0.0
                )
                g = tl.load(gate_rows[:, None] + cols[None, :], mask=wmask, other=0.0)
                u = tl.load(up_rows[:, None] + cols[None, :], mask=wmask, other=0.0)
                acc_g = mma(acc_g, xt, g, F32_DOT)
                acc_u = mma(acc_u, xt, u, F32_DOT)
            if HAS_BIAS:
                b_rows = b13 + expert * 2 * INTER + rn
                acc_g += tl.load(b_rows, mask=rn < INTER, other=0.0).to(tl.float32)[None, :]
                acc_u += tl.load(b_rows + INTER, mask=rn < INTER, other=0.0).to(tl.float32)[None, :]
            h = activate(acc_g, acc_u, ACT)
            out = inter + slots[:, None].to(tl.int64) * INTER + rn[None, :]
            tl.store(out, h.to(inter.dtype.element_ty), mask=valid[:, None] & (rn[None, :] < INTER))

    @triton.jit
    def _grouped_down(
        inter, w2, b2, topk_weights, buf, sorted_ids, block_experts, num_padded, S, H, INTER,
        BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, HAS_BIAS: tl.constexpr,
        PDL: tl.constexpr, F32_DOT: tl.constexpr,
    ):  # fmt: skip
        if PDL:
            tl.extra.cuda.gdc_wait()  # NOTE: inter is the previous kernel's output
            tl.extra.cuda.gdc_launch_dependents()
        slots, valid, expert, live = block_rows(sorted_ids, block_experts, num_padded, S, BM)
        if live:
            rn = tl.program_id(1) * BN + tl.arange(0, BN)
            rk = tl.arange(0, BK)
            a_rows = inter + slots.to(tl.int64) * INTER
            w_rows = w2 + expert.to(tl.int64) * H * INTER + rn.to(tl.int64) * INTER
            acc = tl.zeros((BM, BN), dtype=tl.float32)
            for k0 in range(0, INTER, BK):
                cols = k0 + rk
                a = tl.load(
                    a_rows[:, None] + cols[None, :], mask=valid[:, None] & (cols[None, :] < INTER), other=0.0
                )
                w = tl.load(
                    w_rows[:, None] + cols[None, :],
                    mask=(rn[:, None] < H) & (cols[None, :] < INTER),
                    other=0.0,
                )
                acc = mma(acc, a, w, F32_DOT)
            if HAS_BIAS:
                acc += tl.load(b2 + expert * H + rn, mask=rn < H, other=0.0).to(tl.float32)[None, :]
            acc *= tl.load(topk_weights + slots, mask=valid, other=0.0).to(tl.float32)[:, None]
            out = buf + slots[:, None].to(tl.int64) * H + rn[None, :]
            tl.store(out, acc, mask=valid[:, None] & (rn[None, :] < H))
