"""A step's RoPE cos/sin rows in one launch (Triton, PDL), bit-equal to :func:`ops.rope_cos_sin`.

Every decode step computes ``[T, rotary_dim]`` cos/sin once, from the step's positions, for
every layer's RoPE. In torch that is six kernels (``float``, the outer product, ``cos``,
``sin``, ``cat``, the rounding), each a launch in the graph and none of them PDL. This
kernel does the same float32 math (a rounded int -> float conversion, one IEEE multiply,
CUDA's ``cosf``/``sinf`` through libdevice as torch's kernels call them, one round-to-nearest
to ``dtype``), so its rows equal torch's bit for bit (``tests/models/test_cos_sin.py``).

PDL: ``inv_freq`` (a weight) is read before ``gdc_wait()``; the positions (which a previous
kernel may have written) and the output (whose memory a previous kernel may still read) only
after it. ``GRAPHRT_COS_SIN=0`` keeps the torch ops.
"""

from __future__ import annotations

import torch

from graphrt.kernels.switches import KERNELS_PDL_ENV, pdl_enabled, tl, triton, triton_enabled

#: The kernel's switch (:mod:`graphrt.kernels.switches`).
ENV = "GRAPHRT_COS_SIN"
DTYPES = (torch.bfloat16, torch.float16, torch.float32)
#: Tokens per program.
BLOCK_T = 16


def takes(positions: torch.Tensor, inv_freq: torch.Tensor, dtype: torch.dtype) -> bool:
    """Whether :func:`cos_sin` runs this call (else the torch ops of ``ops.rope_cos_sin``)."""
    return (
        triton_enabled(ENV, positions.device)
        and positions.dim() == 1
        and inv_freq.dim() == 1
        and inv_freq.device == positions.device
        and not positions.dtype.is_floating_point
        and dtype in DTYPES
    )


def cos_sin(positions: torch.Tensor, inv_freq: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``[T, 2 * len(inv_freq)]`` in ``dtype``: each position's cos half then its sin half.

    ``positions [T]`` int (any width), ``inv_freq [rotary_dim / 2]`` (any float dtype: read as
    float32, as the torch path converts it).
    """
    half = inv_freq.shape[0]
    tokens = positions.shape[0]
    out = torch.empty((tokens, 2 * half), dtype=dtype, device=positions.device)
    if tokens:
        pdl = pdl_enabled(KERNELS_PDL_ENV, positions.device)
        _cos_sin[(triton.cdiv(tokens, BLOCK_T),)](
            positions, inv_freq.float().contiguous(), out, tokens, positions.stride(0),
            HALF=half, BLOCK_H=triton.next_power_of_2(half), BLOCK_T=BLOCK_T,
            ACCURATE=positions.device.type == "cuda", PDL=pdl, launch_pdl=pdl,
        )  # fmt: skip
    return out


if triton is not None:
    from triton.language.extra import libdevice

    @triton.jit
    def _cos_sin(
        positions, inv_freq, out, tokens, p_stride,
        HALF: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_T: tl.constexpr, ACCURATE: tl.constexpr,
        PDL: tl.constexpr,
    ):  # fmt: skip
        h = tl.arange(0, BLOCK_H)
        f = tl.load(inv_freq + h, mask=h < HALF, other=0.0)
        if PDL:
            tl.extra.cuda.gdc_wait()
            tl.extra.cuda.gdc_launch_dependents()
        t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
        p = tl.load(positions + t.to(tl.int64) * p_stride, mask=t < tokens, other=0).to(tl.float32)
        angle = p[:, None] * f[None, :]
        mask = (t[:, None] < tokens) & (h[None, :] < HALF)
        at = t[:, None].to(tl.int64) * (2 * HALF) + h[None, :]
        dtype = out.dtype.element_ty
        if ACCURATE:  # NOTE: CUDA's cosf/sinf, as torch's kernels call (the interpreter has none)
            cos, sin = libdevice.cos(angle), libdevice.sin(angle)
        else:
            cos, sin = tl.cos(angle), tl.sin(angle)
        tl.store(out + at, cos.to(dtype), mask=mask)
        tl.store(out + at + HALF, sin.to(dtype), mask=mask)
