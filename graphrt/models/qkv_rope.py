"""The qkv projection with RoPE and the KV store in its epilogue: one launch where there were two.

A single-token decode step projects q, k and v with the fused norm GEMM
(:func:`graphrt.models.prologue.norm_linear`), then ``rope_store`` rotates q and k and writes k
and v to the cache (:mod:`graphrt.kv.rope_store`): two launches of a few µs each, per layer.
:func:`norm_qkv_rope` does both in one (``qkv_rope_gemm``, :mod:`graphrt.models.qkv_rope_kernel`):
the norm GEMM's programs take rows RoPE pairs, round each sum to the activation dtype as the
unfused GEMM's output is rounded, rotate in fp32 with ``rope_store``'s own expressions and round
again, so q and the caches are bit-equal to the two launches. The context says where k and v go
(:meth:`ForwardContext.kv_slot <graphrt.attention.context.ForwardContext.kv_slot>`: one token,
16-bit caches, the layer's own slots); the rest keep the two launches.

PDL as the norm GEMM's: the weights before ``gdc_wait()``; the stream, ``cos_sin`` and the slot
after it (``rope_store`` reads the latter two before it, but layer 0's projection directly follows
the cos/sin kernel, which lets its dependents start before it writes). ``GRAPHRT_QKV_ROPE=1`` switches it on (off by default until
measured on the H100; ``interpret`` runs it under Triton's interpreter); it is a fused-prologue
kernel, so ``GRAPHRT_FUSED_PROLOGUE=0`` or ``GRAPHRT_SKINNY_GEMM=0`` turn it off too. With
``GRAPHRT_DECODE_ROPE=1`` as well, the layers it stores skip the split decode kernel's folded
RoPE (their q is rotated already); the others keep it.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import torch

from graphrt.attention.kv_slot import KVSlot
from graphrt.models import prologue, skinny
from graphrt.models import qkv_rope_kernel as kernels
from graphrt.step.switches import triton, triton_enabled

ENV = "GRAPHRT_QKV_ROPE"
#: Rows of ``W`` a program sums: a quad of rotated columns and its partners (the kernel's layout).
BLOCK_N = 8


def enabled(device: torch.device) -> bool:
    """Whether :data:`ENV` is on (``1``, or ``interpret`` on the CPU) and the fused prologue runs."""
    if os.environ.get(ENV, "0") == "0":  # NOTE: off by default, unlike the other kernels' switches
        return False
    return triton_enabled(ENV, device) and prologue.enabled(device)


def problem(
    x: torch.Tensor, residual: torch.Tensor | None, norm_weight: torch.Tensor, weight: torch.Tensor,
    bias: torch.Tensor | None, cos_sin: torch.Tensor, num_heads: int, slot: KVSlot,
) -> str | None:  # fmt: skip
    """What :func:`norm_qkv_rope` cannot take in these tensors (naming the value and the limit), or None."""
    why = prologue.norm_problem(x, residual, norm_weight, weight, bias)
    if why is not None:
        return why
    _, _, hk, d = slot.k_cache.shape
    if d % 8 or weight.shape[0] != (num_heads + 2 * hk) * d:
        return f"weight {tuple(weight.shape)} is not q, k, v rows of {num_heads} + 2 x {hk} heads of {d} (a multiple of 8)"
    if cos_sin.shape != (1, d) or cos_sin.dtype != x.dtype or not cos_sin.is_contiguous():
        return (
            f"cos_sin {tuple(cos_sin.shape)} {cos_sin.dtype} is not one contiguous row [1, {d}] in {x.dtype}"
        )
    caches = (slot.k_cache, slot.v_cache)
    if any(c.dtype != x.dtype or c.shape != slot.k_cache.shape or not c.is_contiguous() for c in caches):
        return f"the caches are not two contiguous {tuple(slot.k_cache.shape)} tensors in {x.dtype}"
    if slot.loc.shape != (1,) or slot.loc.dtype not in (torch.int32, torch.int64):
        return f"loc {tuple(slot.loc.shape)} {slot.loc.dtype} is not one int32/int64 slot"
    devices = {x.device, cos_sin.device, slot.loc.device, slot.k_cache.device, slot.v_cache.device}
    return "x, cos_sin, the slot and the caches are on different devices" if len(devices) != 1 else None


def project(
    ctx: Any, layer_id: int, chunk: int | None, x: torch.Tensor, residual: torch.Tensor | None,
    norm_weight: torch.Tensor, eps: float, weight: torch.Tensor, bias: torch.Tensor | None,
    cos_sin: torch.Tensor, num_heads: int,
) -> tuple[torch.Tensor, torch.Tensor, KVSlot] | None:  # fmt: skip
    """:func:`norm_qkv_rope` of layer ``layer_id`` where it applies: ``(q, h, slot)``, k and v
    stored at ``slot`` (pass it to ``ctx.attention(..., stored=slot)``); else None, nothing run.

    It applies with :func:`enabled`, a context that gives the layer a slot (``ctx.kv_slot``:
    one token, 16-bit caches, the layer's own slots; ``chunk``: the layer's chunked-local
    size) and tensors the kernel takes (:func:`problem`). Arguments as :func:`norm_qkv_rope`.
    """
    kv_slot = getattr(ctx, "kv_slot", None)  # NOTE: contexts of other kinds store k and v themselves
    if x.shape[0] != 1 or kv_slot is None or not enabled(x.device):
        return None
    slot = kv_slot(layer_id, x.dtype, chunk=chunk)
    if slot is None or problem(x, residual, norm_weight, weight, bias, cos_sin, num_heads, slot) is not None:
        return None
    q, h = norm_qkv_rope(x, residual, norm_weight, eps, weight, bias, cos_sin, num_heads, slot)
    return q, h, slot


def norm_qkv_rope(
    x: torch.Tensor, residual: torch.Tensor | None, norm_weight: torch.Tensor, eps: float,
    weight: torch.Tensor, bias: torch.Tensor | None, cos_sin: torch.Tensor, num_heads: int, slot: KVSlot,
    *, pdl: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """The qkv projection of ``rms_norm(residual + x)``, q and k rotated, k and v stored at ``slot``.

    Parameters
    ----------
    x, residual, norm_weight, eps, weight, bias : as :func:`graphrt.models.prologue.norm_linear`;
        ``weight [(Hq + 2 Hk) D, K]`` holds q's rows, then k's, then v's (``bias`` likewise).
    cos_sin : ``[1, D]`` in ``x``'s dtype: this step's cos half then sin half.
    num_heads : ``Hq``, this rank's query heads; ``Hk`` and ``D`` are the caches'.
    slot : where k and v go (:meth:`ForwardContext.kv_slot`): ``[pages, page_size, Hk, D]`` caches
        in ``x``'s dtype and ``loc [1]``. Only slot ``loc[0]`` of each cache is written.
    pdl : launch with programmatic dependent launch (default: the skinny GEMM's rule).

    Returns
    -------
    ``(q [1, Hq, D], h [1, K])``: q rotated (NeoX halves), and the residual stream ``h`` as
    :func:`~graphrt.models.prologue.norm_linear` returns it; both new tensors. ``ValueError``
    naming the value when the kernel cannot take the tensors (:func:`problem`); nothing written.
    """
    why = problem(x, residual, norm_weight, weight, bias, cos_sin, num_heads, slot)
    if why is not None:
        raise ValueError(f"qkv projection + RoPE + KV store: {why}")
    # NOTE: the norm GEMM's tile with 8 rows: its tile shape, so each row is summed in its order
    tile = dataclasses.replace(prologue.tile_for(*weight.shape, norm=True), block_n=BLOCK_N)
    tile, pdl = list(dataclasses.astuple(tile)), skinny.pdl_default(x.device) if pdl is None else pdl
    q = torch.empty((1, num_heads, slot.k_cache.shape[3]), dtype=x.dtype, device=x.device)
    h = torch.empty_like(x)
    args = (x, residual, norm_weight, float(eps), weight, bias, cos_sin, slot.k_cache, slot.v_cache, slot.loc)
    torch.ops.graphrt.qkv_rope_gemm(*args, q, h, tile, pdl)
    return q, h


def _qkv_rope(
    x: torch.Tensor, residual: torch.Tensor | None, norm_weight: torch.Tensor, eps: float,
    weight: torch.Tensor, bias: torch.Tensor | None, cos_sin: torch.Tensor, k_cache: torch.Tensor,
    v_cache: torch.Tensor, loc: torch.Tensor, q: torch.Tensor, h: torch.Tensor, tile: list[int], pdl: bool,
) -> None:  # fmt: skip
    assert triton is not None, "the qkv + RoPE epilogue needs Triton"
    n, k = weight.shape
    hk, d = k_cache.shape[2], k_cache.shape[3]
    _, block_k, warps, stages = tile  # NOTE: tile[0] is BLOCK_N, fixed by the kernel's row layout
    kernels.qkv_rope_gemm[(n // BLOCK_N,)](
        x, x if residual is None else residual, norm_weight, weight, weight if bias is None else bias,
        q, h, cos_sin, k_cache, v_cache, loc, k, weight.stride(0), eps,
        HQ=q.shape[1], HK=hk, HALF=d // 2, BLOCK_K=block_k, ADD=residual is not None, HAS_BIAS=bias is not None,
        BF16=x.dtype == torch.bfloat16, PDL=pdl, ONE_TILE=k <= block_k, num_warps=warps, num_stages=stages,
        launch_pdl=pdl,
    )  # fmt: skip


# NOTE: a fragment of the ``graphrt`` namespace. Every output is an argument it writes (``!``):
# the emulated engine re-runs a writing op for its writes and copies no returned tensor.
_LIB = torch.library.Library("graphrt", "FRAGMENT")
_LIB.define(
    "qkv_rope_gemm(Tensor x, Tensor? residual, Tensor norm_weight, float eps, Tensor weight, Tensor? bias, "
    "Tensor cos_sin, Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor loc, Tensor(c!) q, Tensor(d!) h, "
    "int[] tile, bool pdl) -> ()"
)
_LIB.impl("qkv_rope_gemm", _qkv_rope, "CompositeExplicitAutograd")
