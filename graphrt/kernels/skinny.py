"""Skinny GEMM: ``y = x @ W^T (+ b)`` for a few rows of ``x``, streaming ``W`` at memory speed.

A decode step multiplies 1-16 token rows by every weight matrix once. cuBLAS inside a graph
reaches only 1.35-2.1 TB/s on 8-32 MB weights (ramp-up and tail per kernel, and PDL gains
nothing across its GEMMs; ``/work/shared/reference/step-floor.md``). This kernel is built for
that regime:

- **Weight streaming**: one program per ``block_n`` rows of ``W`` (row-major, ``[N, K]``) loops
  over ``K`` in ``block_k`` tiles with 16-byte loads along ``K``, one tile loaded ahead of the
  one it multiplies (a register double buffer); a tile with ``stages > 1`` leaves the staging to
  Triton's pipeliner instead (``stages`` tiles in flight through shared memory).
- **PDL**: the program loads its first ``W`` tile and its bias *before* ``gdc_wait()`` (weights
  never depend on the previous kernel), waits, then calls ``gdc_launch_dependents()`` so the next
  kernel's programs can start their own prologue; ``x`` (the previous kernel's output) is read
  only after the wait. Launched with ``launch_pdl=True`` on SM90+.
- **Two inner products**: ``M == 1`` multiplies in fp32 and sums each tile's rows (CUDA cores);
  ``M > 1`` pads ``x`` to ``BLOCK_M >= 16`` rows and uses ``tl.dot`` (tensor cores). Both
  accumulate in fp32, add the bias in fp32 and round once to ``x``'s dtype.
- **float32 weights** (a router kept in float32, :class:`graphrt.models.moe.Gate`): with a
  16-bit ``x`` the weight and bias may both be float32; the kernel widens ``x``'s tiles to fp32
  (exact), multiplies in fp32 (``M > 1``: ``tl.dot`` with ``input_precision="ieee"``, no TF32)
  and writes a float32 output: ``F.linear(x.float(), W, b)`` up to the summation order, with no
  launch to convert ``x``.
- **Deterministic**: no split-K, no atomics. Each output element is summed by one program in a
  fixed order, so a replay equals the eager run bit for bit for a fixed shape and tile. Calls
  with different ``M`` may round differently (another path or tile), as cuBLAS's do.
- **Batch-invariant**: :mod:`graphrt.kernels.invariant` launches it with one tile for every ``M``.
- **No autotuning** (a graph capture cannot benchmark): :func:`tile_for` reads the rule rows
  (by ``M`` and ``K``) and per-shape overrides (``(M class, N, K)``) of the tuning table chosen
  for the GPU when the runtime was built (:mod:`graphrt.kernels.tuning`); the ``tile=`` argument
  replaces it. ``graphrt tune`` (``graphrt bench gemm --sweep``) times candidates on a GPU.
"""

from __future__ import annotations

from dataclasses import astuple

import torch

from graphrt.kernels import tuning
from graphrt.kernels.switches import KERNELS_PDL_ENV, pdl_enabled, tl, triton, triton_enabled

#: The switch of the kernel (:mod:`graphrt.kernels.switches`); ``GRAPHRT_PDL=0`` launches
#: it without programmatic dependent launch.
ENV = "GRAPHRT_SKINNY_GEMM"
PDL_ENV = KERNELS_PDL_ENV
#: ``x``'s dtypes; the weight and bias are in ``x``'s dtype, or both in :data:`WIDE`.
DTYPES = (torch.bfloat16, torch.float16)
#: The weight (and bias) dtype taken with a 16-bit ``x``; the output is then in it too.
WIDE = torch.float32
#: Rows of ``x`` the kernel takes (``ops.linear`` sends it at most ``ops.SKINNY_MAX_M``).
MAX_M = 64
#: ``M`` classes of the tile table: a tile is chosen for the smallest class ``>= M``.
M_CLASSES = (1, 16, 64)
#: A program's tile (:class:`graphrt.kernels.tuning.Tile`, kept here under its old name).
Tile = tuning.Tile


def block_m(m: int) -> int:
    """A launch's ``BLOCK_M`` for ``m`` rows: 1 (a GEMV) or a power of two ``>= 16`` (``tl.dot``'s least)."""
    return 1 if m == 1 else max(16, tuning.pow2(m))


def m_class(m: int) -> int:
    """The smallest of :data:`M_CLASSES` that is ``>= m``."""
    for bound in M_CLASSES:
        if m <= bound:
            return bound
    raise ValueError(f"the skinny GEMM takes at most {MAX_M} rows of x, got {m}")


def tile_for(m: int, n: int, k: int) -> Tile:
    """The tile of ``[m, k] x [n, k]^T`` in the active tuning table (:mod:`graphrt.kernels.tuning`):
    its override for ``(M class, N, K)``, else its first fitting rule row, fitted to ``N`` and ``K``."""
    return tuning.active().skinny_tile(m_class(m), m, n, k).fit(m, n, k)


def enabled(device: torch.device) -> bool:
    """Whether the kernel runs for tensors on ``device`` (:data:`ENV`; CUDA, or the interpreter)."""
    return triton_enabled(ENV, device)


def pdl_default(device: torch.device) -> bool:
    """PDL on SM90+ CUDA devices unless ``GRAPHRT_PDL=0`` (never under the interpreter)."""
    return pdl_enabled(PDL_ENV, device)


def fits(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> bool:
    """Whether :func:`skinny_linear` takes these tensors (else :func:`check` says why)."""
    return problem(x, weight, bias, wide=True) is None


def check(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:
    """Raise ``ValueError`` naming the value and the limit when the kernel cannot take them."""
    why = problem(x, weight, bias, wide=True)
    if why is not None:
        raise ValueError(f"skinny GEMM: {why}")


def out_dtype(x: torch.Tensor, weight: torch.Tensor) -> torch.dtype:
    """The output's dtype: :data:`WIDE` for a float32 weight, else ``x``'s."""
    return WIDE if weight.dtype == WIDE else x.dtype


def _dtype_problem(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, wide: bool) -> str | None:
    weights = (x.dtype, WIDE) if wide else (x.dtype,)
    if x.dtype in DTYPES and w.dtype in weights and (b is None or b.dtype == w.dtype):
        return None
    got = (x.dtype, w.dtype, None if b is None else b.dtype)
    both = f"in x's dtype or both {WIDE}" if wide else "in x's dtype"
    return f"dtypes (x, weight, bias) {got}: x one of {DTYPES}, weight and bias {both}"


def problem(
    x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, max_m: int | None = MAX_M, wide: bool = False
) -> str | None:
    """What the kernel cannot take in these tensors (naming the value and the limit), or None;
    ``max_m``: the most rows (None: any, as :mod:`graphrt.kernels.invariant` takes).

    Dtypes: ``x`` one of :data:`DTYPES`; ``w`` and ``b`` in ``x``'s dtype or (``wide``) both
    :data:`WIDE` (what this module's kernel takes; the default ``wide=False`` is for callers
    whose kernels take 16-bit weights only, the fused prologues of :mod:`graphrt.kernels.prologue`)."""
    if x.dim() != 2 or w.dim() != 2 or x.shape[1] != w.shape[1]:
        return f"x {tuple(x.shape)} and weight {tuple(w.shape)} are not [M, K] and [N, K]"
    if x.shape[0] < 1 or (max_m is not None and x.shape[0] > max_m):
        return f"x has {x.shape[0]} rows; the kernel takes 1..{max_m or 'any'}"
    if why := _dtype_problem(x, w, b, wide):
        return why
    if x.stride(1) != 1 or w.stride(1) != 1 or (b is not None and (b.dim() != 1 or b.stride(0) != 1)):
        return "x, weight and bias need a contiguous last dim"
    if b is not None and b.shape[0] != w.shape[0]:
        return f"bias has {b.shape[0]} entries for {w.shape[0]} output columns"
    if len({x.device, w.device} | ({b.device} if b is not None else set())) != 1:
        return "x, weight and bias are on different devices"
    return None


def skinny_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    tile: Tile | None = None,
    pdl: bool | None = None,
) -> torch.Tensor:
    """``x @ weight^T (+ bias)`` in one Triton launch.

    Parameters
    ----------
    x : ``[M, K]``, bf16 or fp16, ``1 <= M <= MAX_M``, unit stride along ``K``.
    weight : ``[N, K]`` in ``x``'s dtype or float32, unit stride along ``K``.
    bias : ``[N]`` in ``weight``'s dtype, or None.
    tile : the program's tile (default :func:`tile_for`).
    pdl : launch with programmatic dependent launch (default :func:`pdl_default`).

    Returns
    -------
    ``[M, N]`` in :func:`out_dtype` (float32 for a float32 weight, else ``x``'s dtype): fp32
    products and sums, the bias added in fp32, rounded once.
    """
    check(x, weight, bias)
    (m, k), n = x.shape, weight.shape[0]
    tile = tile_for(m, n, k) if tile is None else tile.fit(m, n, k)
    pdl = pdl_default(x.device) if pdl is None else pdl
    return torch.ops.graphrt.skinny_gemm(x, weight, bias, list(astuple(tile)), pdl)


def _skinny_gemm(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, tile: list[int], pdl: bool
) -> torch.Tensor:
    """``tile``: ``Tile``'s fields, then (:mod:`.invariant`) ``-BLOCK_M``: rows per program, any M."""
    assert triton is not None, "the skinny GEMM needs Triton"
    (m, k), n = x.shape, weight.shape[0]
    block_n, block_k, warps, stages = tile[:4]
    out = torch.empty((m, n), dtype=out_dtype(x, weight), device=x.device)
    bm = -tile[4] if len(tile) > 4 else block_m(m)
    # NOTE: fp32 ``tl.dot`` (IEEE) where the interpreter would misread bf16 or the weight is fp32
    f32_dot = not x.is_cuda or weight.dtype == WIDE
    _skinny[(triton.cdiv(n, block_n), triton.cdiv(m, bm))](
        x, weight, weight if bias is None else bias, out, m, n, k, x.stride(0), weight.stride(0),
        BLOCK_M=bm, BLOCK_N=block_n, BLOCK_K=block_k, HAS_BIAS=bias is not None,
        PDL=pdl, F32_DOT=f32_dot, PIPELINED=stages > 1, num_warps=warps, num_stages=stages, launch_pdl=pdl,
    )  # fmt: skip
    return out


# NOTE: one ``torch.ops.graphrt`` op per launch, so the emulated capture engine records and replays
# it like an aten op (a bare Triton launch is invisible to it). ``tile``: ``Tile``'s fields in order.
_LIB = torch.library.Library("graphrt", "FRAGMENT")
_LIB.define("skinny_gemm(Tensor x, Tensor weight, Tensor? bias, int[] tile, bool pdl) -> Tensor")
_LIB.impl("skinny_gemm", _skinny_gemm, "CompositeExplicitAutograd")


if triton is not None:

    @triton.jit
    def w_tile(w_rows, rn, k0, rk, N, K):
        """``W[rn, k0 : k0 + BLOCK_K]`` (zeros past ``N`` and ``K``), ``w_rows`` = row starts."""
        cols = k0 + rk
        mask = (rn[:, None] < N) & (cols[None, :] < K)
        return tl.load(w_rows[:, None] + cols[None, :], mask=mask, other=0.0)

    @triton.jit
    def x_tile(x, rm, cols, M, K, x_stride):
        """``x[rm, cols]`` (zeros past ``M`` and ``K``)."""
        return tl.load(
            x + rm[:, None] * x_stride + cols[None, :],
            mask=(rm[:, None] < M) & (cols[None, :] < K),
            other=0.0,
        )

    @triton.jit
    def _mac(acc, tile, xt, BLOCK_M: tl.constexpr, F32_DOT: tl.constexpr):
        """``acc + xt @ tile^T``: fp32 products summed per row (``M == 1``) or ``tl.dot``."""
        if BLOCK_M == 1:
            return acc + tl.sum(tile.to(tl.float32) * xt.to(tl.float32), axis=1)
        elif F32_DOT:  # NOTE: fp32 weights; and Triton's interpreter multiplies bf16 as raw uint16 bits
            return tl.dot(xt.to(tl.float32), tl.trans(tile.to(tl.float32)), acc, input_precision="ieee")
        else:
            return tl.dot(xt, tl.trans(tile), acc)

    @triton.jit
    def _skinny(
        x, w, bias, y, M, N, K, x_stride, w_stride,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
        HAS_BIAS: tl.constexpr, PDL: tl.constexpr, F32_DOT: tl.constexpr, PIPELINED: tl.constexpr,
    ):  # fmt: skip
        rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
        rk = tl.arange(0, BLOCK_K)
        rm = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
        w_rows = w + rn.to(tl.int64) * w_stride
        if HAS_BIAS:
            b = tl.load(bias + rn, mask=rn < N, other=0.0).to(tl.float32)
        acc = tl.zeros((BLOCK_N,) if BLOCK_M == 1 else (BLOCK_M, BLOCK_N), dtype=tl.float32)
        if PIPELINED:  # NOTE: each tile loaded where it is used: Triton's pipeliner stages them
            if PDL:
                tl.extra.cuda.gdc_wait()  # NOTE: x is the previous kernel's output
                tl.extra.cuda.gdc_launch_dependents()
            for k0 in range(0, K, BLOCK_K):
                xt = x_tile(x, rm, k0 + rk, M, K, x_stride)
                acc = _mac(acc, w_tile(w_rows, rn, k0, rk, N, K), xt, BLOCK_M, F32_DOT)
        else:
            tile = w_tile(w_rows, rn, 0, rk, N, K)  # NOTE: weights only: before the wait
            if PDL:
                tl.extra.cuda.gdc_wait()  # NOTE: x is the previous kernel's output
                tl.extra.cuda.gdc_launch_dependents()
            for k0 in range(0, K, BLOCK_K):
                xt = x_tile(x, rm, k0 + rk, M, K, x_stride)
                ahead = w_tile(w_rows, rn, k0 + BLOCK_K, rk, N, K)  # NOTE: empty mask on the last step
                acc = _mac(acc, tile, xt, BLOCK_M, F32_DOT)
                tile = ahead
        out = acc[None, :] if BLOCK_M == 1 else acc
        if HAS_BIAS:
            out += b[None, :]
        mask = (rm[:, None] < M) & (rn[None, :] < N)
        tl.store(y + rm[:, None] * N + rn[None, :], out.to(y.dtype.element_ty), mask=mask)
