"""Model ops with one torch definition (CPU path and oracle) and fused kernels on GPU.

Each op picks the fused kernel when the tensor is on CUDA in bf16/fp16 and ``sgl_kernel``
imports (:func:`linear`: our Triton skinny GEMM, :mod:`graphrt.kernels.skinny`; for single-row
steps :func:`add_norm_linear` (and :func:`add_norm_linear_keep`) and :func:`silu_mul_linear`
fold the norm or the activation into it, :mod:`graphrt.kernels.prologue`); otherwise the torch code below runs. Both compute in
float32 and round once to the input dtype, so they agree to bf16 rounding (tested per op on
the GPU). None of them syncs the host or allocates outside the graph pool, so all of them
capture.
"""

from __future__ import annotations

import functools
import importlib
from types import ModuleType

import torch
from torch import nn
from torch.nn import functional as F

from graphrt.kernels import cos_sin, fp8_gemm, invariant, prologue, skinny, switches
from graphrt.kernels.switches import batch_invariant_on
from graphrt.kv.rope_store import rotate_ref as apply_rope_ref

FUSED_DTYPES = (torch.bfloat16, torch.float16)
#: Token rows up to which :func:`linear` streams the weight through the skinny GEMM: one. Above
#: one row its best tiles only match cuBLAS and the steps gain nothing (docs/gpu.md, "not kept").
SKINNY_MAX_M = 1


@functools.cache
def _sgl() -> ModuleType | None:
    """``sgl_kernel``, or None when it does not import (or ``GRAPHRT_FUSED_OPS=0`` turns it off)."""
    if not switches.active()["GRAPHRT_FUSED_OPS"]:
        return None
    try:
        return importlib.import_module("sgl_kernel")
    except (ImportError, OSError, RuntimeError):
        return None


def fused(x: torch.Tensor) -> ModuleType | None:
    """``sgl_kernel`` when its fused ops apply to ``x`` (CUDA, bf16/fp16), else None."""
    if not x.is_cuda or x.dtype not in FUSED_DTYPES:
        return None
    return _sgl()


def linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, scale: torch.Tensor | None = None
) -> torch.Tensor:
    """``x @ weight^T (+ bias)``: ``x [..., K]``, ``weight [N, K]``, ``bias [N]``; returns ``[..., N]``.

    ``scale [N]`` float32: ``weight`` is e4m3 standing for ``weight * scale[:, None]``
    (:func:`graphrt.kernels.fp8_gemm.fp8_linear`: its skinny GEMM, or the same math in torch).

    With at most :data:`SKINNY_MAX_M` rows of 16-bit ``x`` on CUDA the skinny GEMM streams the
    weight (PDL on SM90+; ``GRAPHRT_SKINNY_GEMM=0`` forces torch); else ``F.linear`` (cuBLAS).
    Both accumulate in fp32 and round once, so they agree to the output dtype's rounding.
    A float32 ``weight`` (and ``bias``) with 16-bit ``x`` (a float32 router) gives a float32
    output, ``F.linear(x.float(), weight, bias)``: the kernel widens ``x`` as it loads it.
    In a batch-invariant forward (``RuntimeConfig.deterministic``) every ``M`` takes
    :func:`graphrt.kernels.invariant.invariant_linear` instead: a row's bits do not depend on ``M``.
    """
    if scale is not None:
        return fp8_gemm.fp8_linear(x, weight, scale, bias)
    rows = x if x.dim() == 2 else x.reshape(-1, x.shape[-1])
    if batch_invariant_on() and skinny.enabled(x.device) and invariant.fits(rows, weight, bias):
        return invariant.invariant_linear(rows, weight, bias).view(*x.shape[:-1], weight.shape[0])
    if 0 < rows.shape[0] <= SKINNY_MAX_M and skinny.enabled(x.device) and skinny.fits(rows, weight, bias):
        return skinny.skinny_linear(rows, weight, bias).view(*x.shape[:-1], weight.shape[0])
    return F.linear(_widened(x, weight), weight, bias)


class Linear(nn.Linear):
    """``nn.Linear`` (transformers' parameter names and init) whose ``forward`` is :func:`linear`:
    a single-row step streams the weight through the skinny GEMM in the PDL chain, not cuBLAS."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias)


def _widened(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``x`` in float32 for a float32 ``weight`` (exact from 16 bits), as the skinny GEMM reads it."""
    return x.float() if weight.dtype == torch.float32 and x.dtype != torch.float32 else x


def rms_norm_ref(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``x / rms(x) * weight`` over the last dim, float32 inside, ``x``'s dtype out."""
    xf = x.float()
    normed = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (normed * weight.float()).to(x.dtype)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm of ``x [T, H]`` with ``weight [H]``; returns ``[T, H]`` in ``x``'s dtype."""
    sgl = fused(x)
    if sgl is None:
        return rms_norm_ref(x, weight, eps)
    return sgl.rmsnorm(x, weight, eps)


def add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """``residual += x``; returns ``(rms_norm(residual), residual)``.

    On GPU one fused kernel does both in place (``x`` is overwritten with the normed value);
    the torch path returns new tensors. Callers use the returned pair either way.
    """
    sgl = fused(x)
    if sgl is None:
        residual = residual + x
        return rms_norm_ref(residual, weight, eps), residual
    sgl.fused_add_rmsnorm(x, residual, weight, eps)
    return x, residual


def silu_and_mul_ref(gate_up: torch.Tensor) -> torch.Tensor:
    gate, up = gate_up.float().chunk(2, dim=-1)
    return (torch.nn.functional.silu(gate) * up).to(gate_up.dtype)


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` of ``gate_up [T, 2 I]`` (gate first); returns ``[T, I]``."""
    sgl = fused(gate_up)
    if sgl is None or gate_up.shape[-1] * gate_up.element_size() % 16:
        return silu_and_mul_ref(gate_up)
    return sgl.silu_and_mul(gate_up)


def add_norm_linear(
    x: torch.Tensor, residual: torch.Tensor | None, norm_weight: torch.Tensor, eps: float,
    weight: torch.Tensor, bias: torch.Tensor | None = None, scale: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """``linear(rms_norm(h), weight, bias)`` and the residual stream ``h = residual + x``.

    ``x, residual [T, K]`` (``residual`` None: ``h = x``, the first block's input), ``norm_weight
    [K]``, ``weight [N, K]``, ``bias [N]``; returns ``([T, N], h [T, K])``. One row of 16-bit
    ``x`` where the fused prologue runs: one launch (:func:`graphrt.kernels.prologue.norm_linear`,
    ``h`` a new tensor); else :func:`add_rms_norm` (or :func:`rms_norm`) then :func:`linear`,
    which may write ``x`` and ``residual`` in place. Callers use the returned pair either way.
    """
    # NOTE: FP8 weights (``scale``): the norm, then the FP8 GEMM
    if scale is None and _norm_prologue(x, residual, norm_weight, weight, bias, wide=False):
        return prologue.norm_linear(x, residual, norm_weight, eps, weight, bias)
    h, residual = norm_stream(x, residual, norm_weight, eps)
    return linear(h, weight, bias, scale), residual


def add_norm_linear_keep(
    x: torch.Tensor, residual: torch.Tensor | None, norm_weight: torch.Tensor, eps: float,
    weight: torch.Tensor, bias: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
    """:func:`add_norm_linear` that also hands back the normed row: ``(y, normed, h)``.

    For a normed row with several consumers (a MoE layer's router and experts, MLA's two first
    projections): ``y = linear(normed, weight, bias) [T, N]``, ``normed = rms_norm(h) [T, K]``
    and the residual stream ``h = residual + x [T, K]``. ``weight [N, K]`` and ``bias [N]`` in
    ``x``'s dtype, or both float32 (a float32 router: ``y`` float32, as :func:`linear`). One row
    of 16-bit ``x`` where the fused prologue runs: one launch
    (:func:`graphrt.kernels.prologue.norm_keep_linear`, ``normed`` and ``h`` new tensors); else
    :func:`add_rms_norm` (or :func:`rms_norm`) then :func:`linear`, which may write ``x`` and
    ``residual`` in place. Callers use the returned triple either way.
    """
    if _norm_prologue(x, residual, norm_weight, weight, bias, wide=True):
        return prologue.norm_keep_linear(x, residual, norm_weight, eps, weight, bias)
    normed, residual = norm_stream(x, residual, norm_weight, eps)
    return linear(normed, weight, bias), normed, residual


def norm_stream(
    x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(rms_norm(h), h)`` with ``h = residual + x`` (:func:`add_rms_norm`, which may write ``x``
    and ``residual`` in place), or for the first block (``residual`` None, ``x`` the stream)
    ``(rms_norm(x), x)``."""
    if residual is None:
        return rms_norm(x, weight, eps), x
    return add_rms_norm(x, residual, weight, eps)


def _norm_prologue(
    x: torch.Tensor, residual: torch.Tensor | None, norm_weight: torch.Tensor, weight: torch.Tensor,
    bias: torch.Tensor | None, wide: bool,
) -> bool:  # fmt: skip
    """Whether a fused norm prologue takes this step: one row (a batch would take another path,
    so never in a batch-invariant forward), the kernels on, tensors it takes."""
    return (
        x.shape[0] == 1
        and not batch_invariant_on()
        and prologue.enabled(x.device)
        and prologue.norm_problem(x, residual, norm_weight, weight, bias, wide=wide) is None
    )


def silu_mul_linear(
    gate_up: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """``linear(silu_and_mul(gate_up), weight, bias, scale)``: ``gate_up [T, 2 K]`` (gate first),
    ``weight [N, K]``; returns ``[T, N]``. One row of 16-bit ``gate_up`` where the fused prologue
    runs: one launch (:func:`graphrt.kernels.prologue.silu_mul_linear`); else the two ops."""
    one_row = gate_up.dim() == 2 and gate_up.shape[0] == 1 and not batch_invariant_on() and scale is None
    if one_row and prologue.enabled(gate_up.device) and prologue.silu_problem(gate_up, weight, bias) is None:
        return prologue.silu_mul_linear(gate_up, weight, bias)
    return linear(silu_and_mul(gate_up), weight, bias, scale)


def rope_cos_sin(positions: torch.Tensor, inv_freq: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``[T, rotary_dim]``: the cos half then the sin half of each token's angles, in ``dtype``.

    Computed in float32 from ``inv_freq [rotary_dim / 2]`` and rounded once, as transformers does;
    on CUDA in one launch (:mod:`graphrt.kernels.cos_sin`, the same bits).
    """
    if cos_sin.takes(positions, inv_freq, dtype):
        return cos_sin.cos_sin(positions, inv_freq, dtype)
    return rope_cos_sin_ref(positions, inv_freq, dtype)


def rope_cos_sin_ref(positions: torch.Tensor, inv_freq: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """:func:`rope_cos_sin` by torch ops (the oracle of the fused kernel)."""
    freqs = positions.float()[:, None] * inv_freq.float()[None, :]
    return torch.cat((freqs.cos(), freqs.sin()), dim=-1).to(dtype)


def apply_rope(q: torch.Tensor, k: torch.Tensor, cos_sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """NeoX RoPE on ``q [T, Hq, D]`` and ``k [T, Hk, D]`` with this step's ``cos_sin [T, D]``.

    On GPU sgl-kernel's ``rotary_embedding`` rotates both in place, reading row ``t`` of
    ``cos_sin`` for token ``t``; the torch path returns rotated copies.
    """
    sgl = fused(q)
    if sgl is None or not (q.is_contiguous() and k.is_contiguous()):
        return apply_rope_ref(q, cos_sin), apply_rope_ref(k, cos_sin)
    rows = torch.arange(q.shape[0], device=q.device)
    head_dim = q.shape[-1]
    sgl.rotary_embedding(rows, q.view(q.shape[0], -1), k.view(k.shape[0], -1), head_dim, cos_sin, True)
    return q, k
