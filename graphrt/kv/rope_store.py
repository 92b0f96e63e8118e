"""RoPE on q and k fused with the KV store: one kernel per layer on the way into the cache.

A Llama layer's attention input used to take six kernels between the qkv projection and the
attention kernel: two copies making q and k contiguous, an ``arange`` of rows, the rotation,
and one ``index_copy_`` each for k and v. :func:`rope_store` does it in one Triton launch:
it reads q, k and v straight out of the projection's output (any token stride), rotates q into
a new contiguous tensor and k on its way to the cache, and copies v. Per token ``t`` it reads
``q[t]``, ``k[t]``, ``v[t]``, ``cos_sin[t]`` and ``loc[t]``, and writes ``q_out[t]`` and
the cache slot ``loc[t]`` of K and V (the dummy slot for pad rows) — nothing else.

The torch code below is the same math and the oracle (CPU, fp32 caches, Triton switched off).
Both rotate NeoX halves in float32 from the ``cos_sin`` the model rounded to its dtype, and round
once to the output dtype, so they agree to that rounding. An FP8 cache (:mod:`graphrt.kv.quant`)
is written quantised: the rotated k (and v) divided by the layer's scale, saturated at ±448 and
rounded to float8_e4m3fn, the same float32 math in both (correctly rounded division in Triton).

PDL (SM90+, :data:`PDL_ENV`): the kernel loads its ``cos_sin`` row, slot and FP8 scales (written
before the layer) before ``gdc_wait()``, and q, k, v (the projection's output) after it. Its
successors read its outputs only once it has finished: the split decode kernel calls
``gdc_wait()`` before it reads ``q`` and the cache; FA3, the reference backend and torch ops
are plain launches, which wait for it whole.

A single-token decode step that the split decode kernel takes (16-bit cache, no FP8) does not
launch this kernel: the attention context hands the kernel the unrotated q and the new k, v
(the backend ``fuses_store``), and its programs rotate q, and the one holding each request's
newest key stores it by :func:`rotate_heads`, this kernel's own code
(:mod:`graphrt.attention.split_decode.attend`): one launch a layer fewer, the same cache bits.
Prefill, FP8 caches, FA3's steps and the torch switch (``0``) keep this kernel or the torch code.
"""

from __future__ import annotations

import torch

from graphrt.kernels.switches import KERNELS_PDL_ENV, pdl_enabled, tl, triton, triton_enabled
from graphrt.kv.quant import FP8, FP8_MAX, LayerScales
from graphrt.kv.quant import store_slots as store_ref

#: The switch of the fused kernel (:mod:`graphrt.kernels.switches`).
ENV = "GRAPHRT_FUSED_ROPE_STORE"
#: Its PDL switch, the GEMMs' and the decode kernel's (``GRAPHRT_PDL=0``: no PDL).
PDL_ENV = KERNELS_PDL_ENV
FUSED_DTYPES = (torch.bfloat16, torch.float16)


def rotate_ref(x: torch.Tensor, cos_sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x [T, heads, head_dim]`` by NeoX halves (``rotate_half``); returns a new tensor.

    ``cos_sin [T, head_dim]``: each token's cos half then its sin half (``rope_cos_sin``).
    """
    cos, sin = cos_sin[:, None, :].float().chunk(2, dim=-1)
    x1, x2 = x.float().chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).to(x.dtype)


def fits(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cos_sin: torch.Tensor, cache: torch.Tensor
) -> bool:
    """Whether the kernel handles these tensors: one 16-bit dtype for q, k, v and ``cos_sin``,
    the cache in it or FP8, heads packed (``stride(-2) == head_dim``, ``stride(-1) == 1``),
    RoPE over the whole head."""
    d = q.shape[-1]
    packed = all(x.stride(-1) == 1 and x.stride(-2) == d for x in (q, k, v))
    dtypes = {q.dtype, k.dtype, v.dtype, cos_sin.dtype}
    return (
        packed
        and len(dtypes) == 1
        and q.dtype in FUSED_DTYPES
        and cache.dtype in (q.dtype, FP8)
        and cos_sin.shape[-1] == d
        and cos_sin.stride(-1) == 1
        and d % 2 == 0
        and cache.is_contiguous()
    )


def rope_store(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cos_sin: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    loc: torch.Tensor,
    scales: LayerScales | None = None,
    pdl: bool | None = None,
) -> torch.Tensor:
    """Rotate ``q`` and ``k`` by ``cos_sin``, store the rotated ``k`` and ``v`` at slots ``loc``.

    ``q [T, Hq, D]``, ``k``/``v [T, Hk, D]`` (views of a projection are fine: any token
    stride), ``cos_sin [T, D]``, caches ``[pages, page_size, Hk, D]``, ``loc [T]`` int64;
    ``scales``: the layer's dequantisation scales when the caches are FP8; ``pdl``: launch the
    kernel with programmatic dependent launch (default: :func:`pdl_enabled` of :data:`PDL_ENV`). Returns the rotated
    ``q`` ``[T, Hq, D]``, contiguous, in ``q``'s dtype. Inputs are not modified.
    """
    fp8 = k_cache.dtype == FP8
    if fp8 and scales is None:
        raise ValueError("an FP8 KV cache is written with its layer's scales; none were given")
    fused = triton_enabled(ENV, q.device) and fits(q, k, v, cos_sin, k_cache)
    if not (fused and v_cache.dtype == k_cache.dtype and v_cache.is_contiguous()):
        store_ref(k_cache, loc, rotate_ref(k, cos_sin), None if scales is None else scales.k)
        store_ref(v_cache, loc, v, None if scales is None else scales.v)
        return rotate_ref(q, cos_sin)
    tokens, hq, d = q.shape
    out = torch.empty((tokens, hq, d), dtype=q.dtype, device=q.device)
    if tokens:
        hk = k.shape[1]
        # NOTE: a 16-bit cache passes its own (unread) pointers as the scales
        k_scale, v_scale = (scales.k, scales.v) if scales is not None else (k_cache, v_cache)
        pdl = pdl_enabled(PDL_ENV, q.device) if pdl is None else pdl
        _rope_store[(tokens,)](
            q, k, v, cos_sin, out, k_cache, v_cache, loc, k_scale, v_scale,
            q.stride(0), k.stride(0), v.stride(0), cos_sin.stride(0), loc.stride(0),
            HQ=hq, HK=hk, HALF=d // 2,
            BLOCK_HQ=triton.next_power_of_2(hq), BLOCK_HK=triton.next_power_of_2(hk),
            BLOCK_D=triton.next_power_of_2(d // 2), QUANT=fp8, FP8_MAX=FP8_MAX, PDL=pdl, launch_pdl=pdl,
        )  # fmt: skip
    return out


if triton is not None:

    @triton.jit
    def _to_cache(x, src, dst, scale, QUANT: tl.constexpr, FP8_MAX: tl.constexpr):
        """``x`` (float32) as the cache at ``dst`` stores it: rounded to the dtype of ``src``
        (the model's) first, as the torch path's tensors are, then quantised by ``scale`` for
        an FP8 cache. NOTE: pointers, not dtypes, as arguments: Triton 3.6 cannot pass a dtype."""
        dst_ty = dst.dtype.element_ty
        x = x.to(src.dtype.element_ty)
        if QUANT:
            x = tl.fdiv(x.to(tl.float32), scale, ieee_rounding=True)  # NOTE: as torch divides
            x = tl.minimum(tl.maximum(x, -FP8_MAX), FP8_MAX)
            return x.to(dst_ty, fp_downcast_rounding="rtne")
        return x.to(dst_ty)

    @triton.jit
    def rotate_halves(x1, x2, cos, sin):
        """NeoX rotation of the halves ``x1``, ``x2`` (float32). NOTE: the one place of the
        expressions, shared with the split decode kernel, so both round (and fuse) alike."""
        return x1 * cos - x2 * sin, x2 * cos + x1 * sin

    @triton.jit
    def rotate_heads(
        src, dst, cos, sin, d, heads, scale,
        H: tl.constexpr, HALF: tl.constexpr, QUANT: tl.constexpr, FP8_MAX: tl.constexpr,
    ):  # fmt: skip
        """Rotate ``H`` packed heads at ``src`` (row of ``2 * HALF`` each) into ``dst``. NOTE:
        shared with the split decode kernel, which stores its new keys by it: the same bits."""
        mask = (heads[:, None] < H) & (d[None, :] < HALF)
        at = heads[:, None] * (2 * HALF) + d[None, :]
        x1 = tl.load(src + at, mask=mask).to(tl.float32)
        x2 = tl.load(src + at + HALF, mask=mask).to(tl.float32)
        y1, y2 = rotate_halves(x1, x2, cos[None, :], sin[None, :])
        y1 = _to_cache(y1, src, dst, scale, QUANT, FP8_MAX)
        y2 = _to_cache(y2, src, dst, scale, QUANT, FP8_MAX)
        tl.store(dst + at, y1, mask=mask)
        tl.store(dst + at + HALF, y2, mask=mask)

    @triton.jit
    def _rope_store(
        q, k, v, cos_sin, out, k_cache, v_cache, loc, k_scale, v_scale,
        q_stride, k_stride, v_stride, cs_stride, loc_stride,
        HQ: tl.constexpr, HK: tl.constexpr, HALF: tl.constexpr,
        BLOCK_HQ: tl.constexpr, BLOCK_HK: tl.constexpr, BLOCK_D: tl.constexpr,
        QUANT: tl.constexpr, FP8_MAX: tl.constexpr, PDL: tl.constexpr,
    ):  # fmt: skip
        t = tl.program_id(0).to(tl.int64)
        d = tl.arange(0, BLOCK_D)
        cos = tl.load(cos_sin + t * cs_stride + d, mask=d < HALF).to(tl.float32)
        sin = tl.load(cos_sin + t * cs_stride + HALF + d, mask=d < HALF).to(tl.float32)
        slot = tl.load(loc + t * loc_stride).to(tl.int64)
        row = HK * 2 * HALF  # NOTE: one cache slot holds every KV head of the token
        ks, vs = 1.0, 1.0
        if QUANT:
            ks, vs = tl.load(k_scale).to(tl.float32), tl.load(v_scale).to(tl.float32)
        if PDL:
            tl.extra.cuda.gdc_wait()  # NOTE: q, k and v are the previous kernel's output
            tl.extra.cuda.gdc_launch_dependents()
        hq = tl.arange(0, BLOCK_HQ)
        rotate_heads(
            q + t * q_stride, out + t * HQ * 2 * HALF, cos, sin, d, hq, 1.0, HQ, HALF, False, FP8_MAX
        )
        hk = tl.arange(0, BLOCK_HK)
        rotate_heads(k + t * k_stride, k_cache + slot * row, cos, sin, d, hk, ks, HK, HALF, QUANT, FP8_MAX)
        e = tl.arange(0, 2 * BLOCK_D)
        mask = (hk[:, None] < HK) & (e[None, :] < 2 * HALF)
        at = hk[:, None] * (2 * HALF) + e[None, :]
        x = tl.load(v + t * v_stride + at, mask=mask)
        if QUANT:
            x = _to_cache(x.to(tl.float32), v, v_cache, vs, QUANT, FP8_MAX)
        tl.store(v_cache + slot * row + at, x, mask=mask)
