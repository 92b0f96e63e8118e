"""graphrt: LLM decoding as a replay of pre-captured CUDA graphs.

Subpackages follow the data path of one step: ``step`` (modes, batch, config) → ``kv``
(caches, request table) → ``metadata`` (buffer families) → ``attention`` (kinds, contexts,
backends) → ``runtime`` (capture, update, replay) → ``engine`` (requests and scheduling);
``models`` defines models, ``debug`` holds snapshots and parity sweeps (never imported by the
runtime). ``graphrt.buffers`` and ``graphrt.capture`` know nothing of models or attention.
"""

from graphrt.attention import ForwardContext
from graphrt.engine import Engine, EngineStats
from graphrt.kv import KVShape, PagedKVCache, ReqToToken
from graphrt.runtime import (
    CaptureReport,
    GraphFallbackError,
    GraphRuntime,
    HostScalarMismatch,
    PoisonLeft,
    RuntimeStats,
)
from graphrt.step import MODES, Batch, ForwardMode, Limits, RuntimeConfig, SamplingParams

__version__ = "0.1.0"

__all__ = [
    "MODES",
    "Batch",
    "CaptureReport",
    "Engine",
    "EngineStats",
    "ForwardContext",
    "ForwardMode",
    "GraphFallbackError",
    "GraphRuntime",
    "HostScalarMismatch",
    "KVShape",
    "Limits",
    "PagedKVCache",
    "PoisonLeft",
    "ReqToToken",
    "RuntimeConfig",
    "RuntimeStats",
    "SamplingParams",
]
