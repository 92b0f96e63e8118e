"""FA3's per-call options: an FP8 cache's query and descales, and the sinks it takes
(:class:`graphrt.attention.fa3.FA3Backend`)."""

from __future__ import annotations

import torch

from graphrt.kv.quant import LayerScales, is_fp8, query_for

#: FA3's FP8 kernels: head dims up to 256, multiples of 16.
FP8_MAX_HEAD_DIM, FP8_HEAD_ALIGN = 256, 16
#: The kernel holds the sinks in shared memory of 64 bfloat16 (``SmemLayoutSink``).
MAX_SINK_HEADS = 64


def fa3_query(q: torch.Tensor, k_cache: torch.Tensor, kv_scales: LayerScales | None) -> torch.Tensor:
    """``q`` in the cache's dtype (:func:`graphrt.kv.quant.query_for`); raises for what FA3's FP8
    kernels do not take."""
    d = q.shape[-1]
    if is_fp8(k_cache.dtype) and (d > FP8_MAX_HEAD_DIM or d % FP8_HEAD_ALIGN):
        raise ValueError(
            f"FA3 reads an FP8 KV cache for head_dim <= {FP8_MAX_HEAD_DIM} and a multiple of "
            f"{FP8_HEAD_ALIGN}, not {d}: use kv_cache_dtype='auto' or the reference backend"
        )
    return query_for(q, k_cache, kv_scales)


def descale(kv_scales: LayerScales | None, batch: int, kv_heads: int) -> dict[str, torch.Tensor]:
    """``k_descale`` / ``v_descale`` ``[batch, kv_heads]`` for one call (stride-0 views of the
    layer's scales: FA3 reads them with their strides), or nothing for a 16-bit cache."""
    if kv_scales is None:
        return {}
    return {
        "k_descale": kv_scales.k.view(1, 1).expand(batch, kv_heads),
        "v_descale": kv_scales.v.view(1, 1).expand(batch, kv_heads),
    }


def check_sinks(sinks: torch.Tensor | None, num_heads: int) -> None:
    """Refuse sinks the kernel would misread: it takes bf16 ``[num_q_heads]``, contiguous, at
    most :data:`MAX_SINK_HEADS` heads."""
    if sinks is None:
        return
    if sinks.dtype != torch.bfloat16:
        raise ValueError(f"FA3 reads attention sinks as bfloat16, got {sinks.dtype}: keep the model in bf16")
    if tuple(sinks.shape) != (num_heads,) or not sinks.is_contiguous():
        raise ValueError(f"FA3 reads attention sinks as a contiguous [{num_heads}], got {list(sinks.shape)}")
    if num_heads > MAX_SINK_HEADS:
        raise ValueError(f"FA3 holds at most {MAX_SINK_HEADS} sinks per rank, got {num_heads} query heads")
