"""FP8 (e4m3) KV: what a cache slot holds is ``x / scale`` rounded to float8_e4m3fn.

A layer's K and V each have one dequantisation scale (float32, per tensor, as Hugging Face FP8
checkpoints store ``k_scale`` / ``v_scale``; 1.0 when the checkpoint has none). Storing divides
by it and rounds to nearest even, saturating at ±448 (the format's largest finite value, as
vLLM's ``__NV_SATFINITE`` stores do: e4m3fn has no infinity); reading multiplies by it. FA3
takes the scales as ``k_descale`` / ``v_descale`` and the query rounded to FP8 unscaled (the
kernel multiplies ``q·k`` by ``k_descale``). The torch functions here are the oracle: the fused
RoPE + store kernel (:mod:`graphrt.kv.rope_store`) and the reference attention do this math.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

FP8 = torch.float8_e4m3fn
#: The largest finite float8_e4m3fn value: stores saturate here.
FP8_MAX = float(torch.finfo(FP8).max)
#: ``kv_cache_dtype`` names of an MHA/GQA cache → its dtype (``None``: the model's dtype).
MHA_KV_DTYPES: dict[str, torch.dtype | None] = {"auto": None, "fp8_e4m3": FP8}


def is_fp8(dtype: torch.dtype) -> bool:
    return dtype == FP8


def quantize(x: torch.Tensor, scale: torch.Tensor | None = None) -> torch.Tensor:
    """``x / scale`` (``scale`` a float32 tensor broadcasting to ``x``; None: 1) as float8_e4m3fn,
    saturated at ±:data:`FP8_MAX`. Unscaled 16-bit inputs are clamped in their own dtype (448
    is exact in bf16 and fp16), so a query costs two kernels."""
    y = x if scale is None else x.float() / scale
    return y.clamp(-FP8_MAX, FP8_MAX).to(FP8)


def query_for(q: torch.Tensor, cache: torch.Tensor, scales: object | None) -> torch.Tensor:
    """``q`` as a kernel reads it beside ``cache``: rounded to FP8 (unscaled, as FA3 and SGLang
    read it) beside an FP8 cache, else ``q`` itself. An FP8 cache is read with its layer's
    ``scales``: ``ValueError`` when none are given."""
    if not is_fp8(cache.dtype):
        return q
    if scales is None:
        raise ValueError("an FP8 KV cache is read with its layer's scales (kv_scales); none were given")
    return quantize(q)


def dequantize(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``x.float() * scale``: what a stored FP8 value means (float32)."""
    return x.float() * scale


def storage(cache: torch.Tensor) -> torch.Tensor:
    """``cache`` as its bytes for an FP8 cache (``uint8``, same shape), else itself.

    NOTE: index_copy_ / index_select / masked_fill have no float8 kernels on the CPU; copies of
    whole slots go through the bytes, which is exact.
    """
    return cache.view(torch.uint8) if is_fp8(cache.dtype) else cache


def store_slots(
    cache: torch.Tensor, loc: torch.Tensor, x: torch.Tensor, scale: torch.Tensor | None = None
) -> None:
    """``x [T, heads, head_dim]`` into slots ``loc [T]`` of ``cache [pages, page_size, heads,
    head_dim]``: cast to the cache's dtype, or quantised by ``scale`` for an FP8 cache."""
    stored = quantize(x, scale) if is_fp8(cache.dtype) else x.to(cache.dtype)
    storage(cache).view(-1, *x.shape[1:]).index_copy_(0, loc, storage(stored))


@dataclass(frozen=True, slots=True)
class LayerScales:
    """One layer's dequantisation scales: ``k``, ``v`` ``[1]`` float32 views of the cache's
    per-layer tables (static: graphs read them in place, so new scales need no recapture)."""

    k: torch.Tensor
    v: torch.Tensor


@dataclass(frozen=True, slots=True)
class KVScales:
    """Per-layer K and V scales as read from a checkpoint (host floats, one per layer)."""

    k: tuple[float, ...]
    v: tuple[float, ...]

    def __post_init__(self) -> None:
        if len(self.k) != len(self.v):
            raise ValueError(f"{len(self.k)} k scales but {len(self.v)} v scales")
        for name, values in (("k_scale", self.k), ("v_scale", self.v)):
            for layer, value in enumerate(values):
                if not (math.isfinite(value) and value > 0):
                    raise ValueError(f"layer {layer}: {name} must be a finite number > 0, got {value}")

    @classmethod
    def ones(cls, num_layers: int) -> KVScales:
        return cls((1.0,) * num_layers, (1.0,) * num_layers)

    @classmethod
    def of(cls, k: Sequence[float], v: Sequence[float]) -> KVScales:
        return cls(tuple(float(x) for x in k), tuple(float(x) for x in v))
