"""Which modes an engine's runtime graphs: MIXED only where the model's backend serves it.

An engine asks for MIXED graphs for its prefill steps (``EngineConfig.prefill_graph_tokens``)
and chunked steps (``prefill_chunk``) as an optimisation: a model whose runtime cannot graph
MIXED runs those steps eagerly instead of being refused. :func:`graphable` is asked once the
model's KV cache exists (it decides the attention kind), before its runtime is built.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from graphrt.attention import attention_kind
from graphrt.attention.needs import runtime_needs
from graphrt.capture import BucketPolicy
from graphrt.step.config import RuntimeConfig
from graphrt.step.modes import ForwardMode


def without_mixed(config: RuntimeConfig) -> RuntimeConfig:
    """``config`` without MIXED and its token buckets (itself when it has none): an
    encoder-decoder model's (graphed for DECODE only)."""
    if ForwardMode.MIXED not in config.capture_modes:
        return config
    others = tuple(m for m in config.capture_modes if m is not ForwardMode.MIXED)
    return dataclasses.replace(config, capture_modes=others, token_buckets=())


def graphable(config: RuntimeConfig, kv: Any, forward: Any) -> RuntimeConfig:
    """``config``, less MIXED where a runtime of ``forward`` over ``kv`` could not graph it:
    the backend that ``config``'s other modes select must serve MIXED too (``GraphSupport``;
    sparse MLA's do not), so asking for MIXED never moves a model to another backend."""
    rest = without_mixed(config)
    if rest is config:
        return config
    kind = attention_kind(kv)
    largest = BucketPolicy.create(config.max_batch_size, config.buckets).largest
    backend = kind.select_backend(
        config.backend, kv.device, runtime_needs(kind.name, kv, rest, largest, forward)
    )
    needs = runtime_needs(kind.name, kv, config, largest, forward)
    return config if backend.graph_support.refusal(backend.name, needs) is None else rest
