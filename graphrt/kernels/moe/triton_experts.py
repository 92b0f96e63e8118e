"""The fused Triton path of :func:`graphrt.kernels.moe.fused_experts`: which kernels, which tiles.

``T * k <=`` :func:`max_skinny_slots` (decode at bs 1-4 with k = 8): the skinny kernels
(:mod:`graphrt.kernels.moe.skinny_experts`, two launches, no alignment). Else the alignment
(:func:`graphrt.kernels.moe.align.moe_align`, written into ``routing``), the two grouped GEMMs
(:mod:`graphrt.kernels.moe.grouped`) and a reduction over ``k`` in a fixed order. Intermediates
are sized by ``T * k`` and the static bounds only, so the launches capture into a CUDA graph and
replay for any routing; nothing is read on the host.
"""

from __future__ import annotations

import torch

from graphrt.kernels import tuning
from graphrt.kernels.moe import ExpertWeights, Routing
from graphrt.kernels.moe.align import BLOCK_M, PDL_ENV, block_bound, moe_align
from graphrt.kernels.moe.align import ENV as ALIGN_ENV
from graphrt.kernels.moe.grouped import ACT_CODES, _grouped_down, _grouped_up
from graphrt.kernels.moe.skinny_experts import _skinny_down, _skinny_up, _sum_parts
from graphrt.kernels.switches import pdl_enabled, tl, triton, triton_enabled

#: The switch of the MoE kernels (:data:`graphrt.kernels.moe.align.ENV`).
ENV = ALIGN_ENV
DTYPES = (torch.bfloat16, torch.float16, torch.float32)
#: Entries of ``out`` per program of the split skinny down's sum.
SUM_BLOCK = 1024


#: The tiles of the grouped and skinny expert kernels (the tuning table's ``moe`` field).
#: NOTE: 8 warps: on 4, sm_90's 64-bit tile pointers take 228-255 registers and the up GEMM
#: spills (``tests/kernels/test_moe_ptx.py`` checks none spills).
Tiles = tuning.MoeTiles


def enabled(device: torch.device) -> bool:
    """Whether the Triton kernels run for tensors on ``device`` (:data:`ENV`)."""
    return triton_enabled(ENV, device)


def check_experts(x: torch.Tensor, w: ExpertWeights, routing: Routing) -> None:
    """``ValueError`` naming the value and the limit when the kernels cannot take these tensors."""
    num_experts, two_i, hidden = w.w13.shape
    shapes = {
        "w2": (w.w2, (num_experts, hidden, two_i // 2)),
        "b13": (w.b13, (num_experts, two_i)),
        "b2": (w.b2, (num_experts, hidden)),
    }
    if x.dim() != 2 or x.shape[1] != hidden or two_i % 2:
        raise ValueError(f"x {tuple(x.shape)} and w13 {tuple(w.w13.shape)} are not [T, H] and [E, 2 I, H]")
    for name, (t, want) in shapes.items():
        if t is not None and tuple(t.shape) != want:
            raise ValueError(f"{name} is {tuple(t.shape)}; w13 {tuple(w.w13.shape)} needs {want}")
    tensors = [t for t in (w.w13, w.w2, w.b13, w.b2) if t is not None]
    if x.dtype not in DTYPES or any(t.dtype != x.dtype for t in tensors):
        got = [x.dtype] + [t.dtype for t in tensors]
        raise ValueError(f"dtypes of x and the expert weights {got}: all one of {DTYPES}")
    if x.stride(1) != 1 or not all(t.is_contiguous() for t in tensors):
        raise ValueError("x needs a contiguous last dim and the expert weights to be contiguous")
    if w.activation not in ACT_CODES:
        raise ValueError(f"activation {w.activation!r} is not one of {tuple(ACT_CODES)}")
    ids, weights = routing.topk_ids, routing.topk_weights
    if ids.shape != weights.shape or ids.dim() != 2 or ids.shape[0] != x.shape[0]:
        raise ValueError(
            f"topk_ids {tuple(ids.shape)}, topk_weights {tuple(weights.shape)} for x {tuple(x.shape)}"
        )
    if ids.dtype != torch.int32 or not ids.is_contiguous() or not weights.is_contiguous():
        raise ValueError(f"topk_ids must be contiguous int32 (got {ids.dtype}), topk_weights contiguous")


def max_skinny_slots() -> int:
    """Largest ``T * k`` the skinny path takes: the active tuning table's ``moe_skinny_slots``."""
    return tuning.active().moe_skinny_slots


def fused_experts_triton(
    x: torch.Tensor, w: ExpertWeights, routing: Routing, skinny_slots: int | None = None
) -> torch.Tensor:
    """:func:`graphrt.kernels.moe.fused_experts` in Triton kernels (see the module docstring);
    the skinny kernels up to ``skinny_slots`` token slots (0: always the grouped GEMMs; None: the
    tuning table's, :func:`max_skinny_slots`)."""
    check_experts(x, w, routing)
    skinny_slots = max_skinny_slots() if skinny_slots is None else skinny_slots
    tokens, topk = routing.topk_ids.shape
    if tokens == 0:
        return torch.zeros_like(x)
    pdl = pdl_enabled(PDL_ENV, x.device)
    if tokens * topk <= skinny_slots:
        return _skinny(x, w, routing, pdl)
    moe_align(routing.topk_ids, w.num_experts, routing)
    return _grouped(x, w, routing, pdl)


def _skinny(x: torch.Tensor, w: ExpertWeights, routing: Routing, pdl: bool) -> torch.Tensor:
    (tokens, hidden), (num_experts, two_i, _), topk = x.shape, w.w13.shape, routing.topk_ids.shape[1]
    inter_dim, t = two_i // 2, tuning.active().moe
    inter = torch.empty((tokens * topk, inter_dim), dtype=x.dtype, device=x.device)
    out = torch.empty_like(x)
    (up_n, up_k, up_warps), (down_n, down_k, down_warps) = t.skinny_up(), t.skinny_down()
    bk_up, bk_down = min(up_k, tuning.pow2(hidden)), min(down_k, tuning.pow2(inter_dim))
    _skinny_up[(tokens * topk, triton.cdiv(inter_dim, up_n // 2))](
        x, w.w13, _or(w.b13, w.w13), inter, routing.topk_ids, num_experts, hidden, inter_dim, topk,
        x.stride(0), BN=up_n // 2, BK=bk_up, ACT=ACT_CODES[w.activation],
        HAS_BIAS=w.b13 is not None, PDL=pdl, num_warps=up_warps, launch_pdl=pdl,
    )  # fmt: skip
    split = min(t.skinny_down_split, topk)
    parts = out if split == 1 else torch.empty((split, tokens, hidden), dtype=torch.float32, device=x.device)
    _skinny_down[(tokens, triton.cdiv(hidden, down_n), split)](
        inter, w.w2, _or(w.b2, w.w2), routing.topk_ids, routing.topk_weights, parts, num_experts,
        hidden, inter_dim, topk, triton.cdiv(inter_dim, bk_down), BN=down_n, BK=bk_down, SPLIT=split,
        HAS_BIAS=w.b2 is not None, PDL=pdl, num_warps=down_warps, launch_pdl=pdl,
    )  # fmt: skip
    if split > 1:
        n = tokens * hidden
        _sum_parts[(triton.cdiv(n, SUM_BLOCK),)](
            parts, out, n, SPLIT=split, BLOCK=SUM_BLOCK, PDL=pdl, num_warps=4, launch_pdl=pdl
        )
    return out


def _grouped(x: torch.Tensor, w: ExpertWeights, routing: Routing, pdl: bool) -> torch.Tensor:
    (tokens, hidden), (num_experts, two_i, _), topk = x.shape, w.w13.shape, routing.topk_ids.shape[1]
    inter_dim, t, slots = two_i // 2, tuning.active().moe, tokens * topk
    blocks = block_bound(tokens, topk, num_experts)
    inter = torch.empty((slots, inter_dim), dtype=x.dtype, device=x.device)
    buf = torch.empty((slots, hidden), dtype=torch.float32, device=x.device)
    f32 = x.dtype == torch.float32 or not x.is_cuda
    aligned = (routing.sorted_ids, routing.block_experts, routing.num_padded, slots)
    _grouped_up[(blocks, triton.cdiv(inter_dim, t.block_n))](
        x, w.w13, _or(w.b13, w.w13), inter, *aligned, hidden, inter_dim, topk, x.stride(0),
        BM=BLOCK_M, BN=t.block_n, BK=t.block_k, ACT=ACT_CODES[w.activation], HAS_BIAS=w.b13 is not None,
        PDL=pdl, F32_DOT=f32, num_warps=t.warps, num_stages=t.stages, launch_pdl=pdl,
    )  # fmt: skip
    _grouped_down[(blocks, triton.cdiv(hidden, t.block_n))](
        inter, w.w2, _or(w.b2, w.w2), routing.topk_weights, buf, *aligned, hidden, inter_dim,
        BM=BLOCK_M, BN=t.block_n, BK=t.block_k, HAS_BIAS=w.b2 is not None, PDL=pdl, F32_DOT=f32,
        num_warps=t.warps, num_stages=t.stages, launch_pdl=pdl,
    )  # fmt: skip
    out = torch.empty_like(x)
    block_h = min(1024, tuning.pow2(hidden))
    _sum_topk[(tokens, triton.cdiv(hidden, block_h))](
        buf, routing.topk_ids, out, num_experts, hidden, topk, BH=block_h, PDL=pdl, launch_pdl=pdl
    )
    return out


def _or(t: torch.Tensor | None, other: torch.Tensor) -> torch.Tensor:
    return other if t is None else t  # NOTE: a pointer the kernel never reads (HAS_BIAS False)


if triton is not None:

    @triton.jit
    def _sum_topk(buf, topk_ids, out, E, H, TOPK, BH: tl.constexpr, PDL: tl.constexpr):
        """``out[t] = sum_j buf[t k + j]`` over the token's routed slots, in slot order."""
        if PDL:
            tl.extra.cuda.gdc_wait()  # NOTE: buf is the previous kernel's output
            tl.extra.cuda.gdc_launch_dependents()
        t = tl.program_id(0)
        rh = tl.program_id(1) * BH + tl.arange(0, BH)
        acc = tl.zeros((BH,), dtype=tl.float32)
        for j in range(0, TOPK):
            slot = t * TOPK + j
            ok = tl.load(topk_ids + slot) < E
            acc += tl.load(buf + slot.to(tl.int64) * H + rh, mask=ok & (rh < H), other=0.0)
        tl.store(out + t.to(tl.int64) * H + rh, acc.to(out.dtype.element_ty), mask=rh < H)
