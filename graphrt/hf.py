"""Run an unmodified ``transformers`` causal LM under graphrt: ``graphrt.hf.wrap(model)``.

``import graphrt.hf`` (it imports transformers lazily, at :func:`wrap`). The wrapper lives in
:mod:`graphrt.models.hf_wrap`; :func:`stack` builds its paged KV cache, request table and
runtime like :func:`graphrt.engine.stack.stack_for` does for a loaded checkpoint.
"""

from __future__ import annotations

from torch import nn

from graphrt.engine.stack import ModelStack, stack_for
from graphrt.models.hf_wrap import (
    ATTENTION_NAME,
    CTX_KWARG,
    HFWrapped,
    KVGeometry,
    check_capturable,
    graphrt_attention,
    kv_geometry,
    wrap,
)
from graphrt.step.config import RuntimeConfig

__all__ = [
    "ATTENTION_NAME",
    "CTX_KWARG",
    "HFWrapped",
    "KVGeometry",
    "check_capturable",
    "graphrt_attention",
    "kv_geometry",
    "stack",
    "wrap",
]


def stack(
    model: nn.Module, config: RuntimeConfig, *, max_reqs: int | None = None, kv_cache_dtype: str | None = None
) -> ModelStack:
    """Wrap ``model`` (unless it already is) and build its KV cache, ``ReqToToken`` and ``GraphRuntime``.

    The KV cache holds ``max_reqs`` (default ``config.max_batch_size``) full-context requests plus
    the dummy page, in the model's parameter dtype (or FP8 for ``kv_cache_dtype="fp8_e4m3"``,
    scales 1.0), on its device.
    """
    wrapped = model if isinstance(model, HFWrapped) else wrap(model)
    return stack_for(wrapped, config, max_reqs=max_reqs, kv_cache_dtype=kv_cache_dtype)
