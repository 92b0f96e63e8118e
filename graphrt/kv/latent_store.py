"""Dense MLA's attention prologue in one kernel: RoPE on q and k, the latent's RMSNorm, the store.

Between its projections and the attention kernel a dense-MLA layer (:mod:`graphrt.models.mla`)
used to run some thirty small torch kernels: per rotation (q and k) a ``cat`` de-interleaving
the pairs, casts, four products, a sum and a difference, a ``cat`` and a cast back; the latent's
RMSNorm; one ``index_copy_`` each for the RoPE key and the latent. :func:`rope_norm_store` does
it in one Triton launch, reading straight out of the projections' outputs: per token ``t`` it
reads ``q[t, :, nope:]``, ``kv[t]``, ``cos_sin[t]``, ``loc[t]`` and the norm's weight, and
writes the rotated ``q_rope[t]`` (a new contiguous tensor) and cache slot ``loc[t]`` of the
RoPE-key and latent caches (the dummy slot for pad rows) — nothing else.

Same math as the torch path the model keeps (its oracle, and what runs on the CPU, with
``GRAPHRT_FUSED_ROPE_STORE=0`` or for tensors :func:`fits` refuses): the rotation of
:func:`~graphrt.kv.rope_store.rotate_ref` in float32 from the model-dtype ``cos_sin``, on the
pairs ``(x[2i], x[2i+1])`` when ``interleave`` (DeepSeek's layout, written de-interleaved:
even lanes' results, then odd lanes') or the NeoX halves otherwise; the RMSNorm of
``graphrt.models.ops.rms_norm_ref`` (float32: ``x * rsqrt(mean(x^2) + eps) * weight``); each
rounded once to the model's dtype, so the two agree to that rounding.

PDL (SM90+, :data:`PDL_ENV`): the kernel loads its ``cos_sin`` row, its slot and the norm weight
(written before the layer) before ``gdc_wait()``, the projections' outputs after it. Its
readers (the ``qv`` GEMM, FA3, torch ops) are plain launches, which wait for it whole.
"""

from __future__ import annotations

import torch

from graphrt.kernels.switches import KERNELS_PDL_ENV, pdl_enabled, tl, triton, triton_enabled
from graphrt.kv.rope_store import ENV as ROPE_STORE_ENV

#: The switch of the fused kernel (:mod:`graphrt.kernels.switches`): the MHA RoPE store's.
ENV = ROPE_STORE_ENV
#: Its PDL switch, the other kernels' (``GRAPHRT_PDL=0``: no PDL).
PDL_ENV = KERNELS_PDL_ENV
FUSED_DTYPES = (torch.bfloat16, torch.float16)


def enabled(device: torch.device) -> bool:
    """Whether the kernel runs for tensors on ``device`` (its switch, Triton present)."""
    return triton_enabled(ENV, device)


def fits(
    q: torch.Tensor,
    kv: torch.Tensor,
    cos_sin: torch.Tensor,
    weight: torch.Tensor,
    rope_cache: torch.Tensor,
    latent_cache: torch.Tensor,
) -> bool:
    """Whether the kernel handles these tensors: ``q [T, H, nope + rope]``, ``kv [T, c + rope]``
    and ``cos_sin [T, rope]`` (rope even) in one 16-bit dtype with unit last strides (any token
    or head stride), ``weight [c]`` contiguous, both caches contiguous one-head caches in that
    dtype (an FP8 cache keeps the torch path's cast)."""
    rope = cos_sin.shape[-1]
    latent = kv.shape[-1] - rope
    dtypes = {q.dtype, kv.dtype, cos_sin.dtype, rope_cache.dtype, latent_cache.dtype}
    return (
        len(dtypes) == 1
        and q.dtype in FUSED_DTYPES
        and q.dim() == 3
        and kv.dim() == 2
        and all(x.stride(-1) == 1 for x in (q, kv, cos_sin))
        and rope % 2 == 0
        and q.shape[-1] >= rope
        and latent > 0
        and weight.shape == (latent,)
        and weight.is_contiguous()
        and rope_cache.shape[-2:] == (1, rope)
        and latent_cache.shape[-2:] == (1, latent)
        and rope_cache.is_contiguous()
        and latent_cache.is_contiguous()
    )


def rope_norm_store(
    q: torch.Tensor,
    kv: torch.Tensor,
    cos_sin: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    rope_cache: torch.Tensor,
    latent_cache: torch.Tensor,
    loc: torch.Tensor,
    interleave: bool,
    pdl: bool | None = None,
) -> torch.Tensor:
    """Rotate ``q``'s RoPE part and ``kv``'s RoPE key, RMS-norm ``kv``'s latent, store both at ``loc``.

    ``q [T, H, nope + rope]`` (the q projection's output), ``kv [T, c + rope]``
    (``kv_a_proj_with_mqa``'s: latent then RoPE key), ``cos_sin [T, rope]`` (cos half, sin
    half), ``weight [c]`` the latent norm's, ``rope_cache [pages, page_size, 1, rope]``,
    ``latent_cache [pages, page_size, 1, c]``, ``loc [T]`` int64 (any stride); ``interleave``:
    DeepSeek's paired layout (``cfg.rope_interleave``); ``pdl``: launch with programmatic
    dependent launch (default: :func:`pdl_enabled` of :data:`PDL_ENV`). Returns the rotated
    ``q_rope [T, H, rope]``, contiguous, in ``q``'s dtype. Inputs are not modified. Raises
    ``ValueError`` for tensors :func:`fits` refuses.
    """
    if not fits(q, kv, cos_sin, weight, rope_cache, latent_cache):
        raise ValueError(
            f"the fused MLA store takes 16-bit q {tuple(q.shape)} / kv {tuple(kv.shape)} / cos_sin "
            f"{tuple(cos_sin.shape)} and caches of that dtype; got {q.dtype}, {kv.dtype}, "
            f"{cos_sin.dtype}, caches {rope_cache.dtype} {tuple(rope_cache.shape)} / "
            f"{latent_cache.dtype} {tuple(latent_cache.shape)}, weight {tuple(weight.shape)}"
        )
    tokens, heads, width = q.shape
    rope = cos_sin.shape[-1]
    latent = kv.shape[-1] - rope
    out = torch.empty((tokens, heads, rope), dtype=q.dtype, device=q.device)
    if tokens:
        pdl = pdl_enabled(PDL_ENV, q.device) if pdl is None else pdl
        _mla_store[(tokens,)](
            q, kv, cos_sin, weight, out, rope_cache, latent_cache, loc,
            q.stride(0), q.stride(1), kv.stride(0), cos_sin.stride(0), loc.stride(0), eps,
            H=heads, NOPE=width - rope, HALF=rope // 2, C=latent,
            BLOCK_H=triton.next_power_of_2(heads), BLOCK_D=triton.next_power_of_2(rope // 2),
            BLOCK_C=triton.next_power_of_2(latent), INTERLEAVE=interleave, PDL=pdl, launch_pdl=pdl,
        )  # fmt: skip
    return out


if triton is not None:
    from graphrt.kv.rope_store import rotate_halves

    @triton.jit
    def _rotate_rows(
        src, src_rows, dst, dst_rows, rows_mask, cos, sin,
        HALF: tl.constexpr, BLOCK_D: tl.constexpr, INTERLEAVE: tl.constexpr,
    ):  # fmt: skip
        """Rotate the rows at ``src + src_rows`` (``[R, 1]`` offsets) into ``dst + dst_rows``:
        pairs ``(2i, 2i+1)`` (``INTERLEAVE``) or halves ``(i, i + HALF)`` in, halves out."""
        d = tl.arange(0, BLOCK_D)
        mask = rows_mask & (d[None, :] < HALF)
        if INTERLEAVE:
            first = src_rows + 2 * d[None, :]
            second = first + 1
        else:
            first = src_rows + d[None, :]
            second = first + HALF
        x1 = tl.load(src + first, mask=mask).to(tl.float32)
        x2 = tl.load(src + second, mask=mask).to(tl.float32)
        y1, y2 = rotate_halves(x1, x2, cos[None, :], sin[None, :])
        at = dst_rows + d[None, :]
        tl.store(dst + at, y1.to(dst.dtype.element_ty), mask=mask)
        tl.store(dst + at + HALF, y2.to(dst.dtype.element_ty), mask=mask)

    @triton.jit
    def _mla_store(
        q, kv, cos_sin, weight, out, rope_cache, latent_cache, loc,
        q_stride, q_head_stride, kv_stride, cs_stride, loc_stride, eps,
        H: tl.constexpr, NOPE: tl.constexpr, HALF: tl.constexpr, C: tl.constexpr,
        BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_C: tl.constexpr,
        INTERLEAVE: tl.constexpr, PDL: tl.constexpr,
    ):  # fmt: skip
        t = tl.program_id(0).to(tl.int64)
        d = tl.arange(0, BLOCK_D)
        cos = tl.load(cos_sin + t * cs_stride + d, mask=d < HALF).to(tl.float32)
        sin = tl.load(cos_sin + t * cs_stride + HALF + d, mask=d < HALF).to(tl.float32)
        slot = tl.load(loc + t * loc_stride).to(tl.int64)
        c = tl.arange(0, BLOCK_C)
        w = tl.load(weight + c, mask=c < C).to(tl.float32)
        if PDL:
            tl.extra.cuda.gdc_wait()  # NOTE: q and kv are the projections' output
            tl.extra.cuda.gdc_launch_dependents()
        h = tl.arange(0, BLOCK_H)[:, None]
        _rotate_rows(
            q + t * q_stride + NOPE, h * q_head_stride, out + t * H * 2 * HALF, h * (2 * HALF),
            h < H, cos, sin, HALF, BLOCK_D, INTERLEAVE,
        )  # fmt: skip
        one = tl.arange(0, 1)[:, None]  # NOTE: the one RoPE key every head shares
        _rotate_rows(
            kv + t * kv_stride + C, one, rope_cache + slot * 2 * HALF, one, one < 1,
            cos, sin, HALF, BLOCK_D, INTERLEAVE,
        )  # fmt: skip
        x = tl.load(kv + t * kv_stride + c, mask=c < C).to(tl.float32)
        rms = tl.rsqrt(tl.sum(x * x, axis=0) / C + eps)
        y = x * rms * w  # NOTE: torch's order: normed first, then the weight
        tl.store(latent_cache + slot * C + c, y.to(latent_cache.dtype.element_ty), mask=c < C)
