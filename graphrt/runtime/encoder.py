"""What a runtime checks of an encoder-decoder model's encoder cache before it builds anything."""

from __future__ import annotations

from graphrt.kv import EncoderKV, PagedKVCache, ReqToToken
from graphrt.metadata.encoder import EncoderShape
from graphrt.step.config import RuntimeConfig
from graphrt.step.modes import ForwardMode

#: Modes a runtime with an encoder cache may capture (cross-attention is graphed for DECODE).
CROSS_GRAPHED = frozenset({ForwardMode.DECODE})


def encoder_geometry(
    encoder: EncoderKV | None, kv: object, req_to_token: ReqToToken, config: RuntimeConfig
) -> EncoderShape | None:
    """The encoder group's geometry, or None without an encoder cache.

    Raises ``ValueError`` for what cross-attention does not support: a cache other than a
    paged MHA/GQA one, speculative decoding, capture modes other than DECODE, or an encoder
    table whose request rows differ from ``req_to_token``'s (pad rows read its dummy row).
    """
    if encoder is None:
        return None
    if not isinstance(kv, PagedKVCache):
        raise ValueError(f"cross-attention needs a paged MHA/GQA KV cache, got {type(kv).__name__}")
    extra = sorted(m.name for m in config.capture_modes if m not in CROSS_GRAPHED)
    if extra or config.speculative is not None:
        what = f"capture_modes {', '.join(extra)}" if extra else "speculative decoding"
        raise ValueError(f"an encoder-decoder model is graphed for DECODE only, not {what}")
    if encoder.max_reqs != req_to_token.max_reqs:
        raise ValueError(
            f"the encoder cache holds {encoder.max_reqs} request rows, req_to_token {req_to_token.max_reqs}"
        )
    if encoder.kv.device != kv.device:
        raise ValueError(f"the encoder cache is on {encoder.kv.device}, the KV cache on {kv.device}")
    return EncoderShape(encoder.max_pages)
