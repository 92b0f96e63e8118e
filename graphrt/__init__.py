"""graphrt: LLM decoding as a replay of pre-captured CUDA graphs."""

from graphrt.batch import Batch, Limits
from graphrt.config import RuntimeConfig
from graphrt.context import ForwardContext
from graphrt.engine import Engine, EngineStats
from graphrt.kv_cache import KVShape, PagedKVCache, ReqToToken
from graphrt.modes import MODES, ForwardMode
from graphrt.runtime import (
    CaptureReport,
    GraphFallbackError,
    GraphRuntime,
    HostScalarMismatch,
    PoisonLeft,
    RuntimeStats,
)

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
]
