"""What a runtime asks of its attention backend, read off its cache, config, model and encoder."""

from __future__ import annotations

from typing import Any

from graphrt.attention.capabilities import Needs
from graphrt.kv.quant import FP8
from graphrt.step.config import RuntimeConfig


def model_config(forward: Any) -> Any:
    """The model config a forward carries (``cfg``, on it or on a bound method's object), or None."""
    for owner in (forward, getattr(forward, "__self__", None)):
        cfg = getattr(owner, "cfg", None)
        if cfg is not None:
            return cfg
    return None


def runtime_needs(
    kind: str, kv: Any, config: RuntimeConfig, largest: int, forward: Any = None, encoder: Any = None
) -> Needs:
    """The :class:`Needs` of a runtime of attention kind ``kind`` over ``kv`` built with
    ``config`` (capture modes up to bucket ``largest``) for ``forward`` (its model config says
    whether layers slide a window or have sinks; a forward without one is checked per layer by
    its context) and ``encoder`` (an encoder-decoder model's cache)."""
    spec, cfg = config.speculative, model_config(forward)
    owner = getattr(forward, "__self__", forward)
    uses = {
        "trees": spec is not None and spec.topk > 1,
        "window": bool(getattr(kv, "window_layers", ())) or getattr(cfg, "sliding_window", None) is not None,
        "sinks": bool(getattr(cfg, "sinks", False)),
        "fp8_kv": getattr(kv, "dtype", None) == FP8 or getattr(kv, "layout", None) == "fp8",
        "qv": kind == "mla",
        "cross": encoder is not None,
        "chunked_local": config.attention_chunk_size is not None,
    }
    model = f"the model ({type(owner).__name__})" if owner is not None else "the model"
    features = frozenset(f for f, used in uses.items() if used)
    return Needs(tuple(config.capture_modes), largest, features, model)
