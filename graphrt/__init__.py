"""graphrt: LLM decoding as a replay of pre-captured CUDA graphs.

Subpackages follow the data path of one step: ``step`` (modes, batch, config) → ``kv``
(caches, request table) → ``metadata`` (buffer groups) → ``attention`` (kinds, contexts,
backends) → ``runtime`` (capture, update, replay) → ``engine`` (requests and scheduling);
``models`` defines models, ``debug`` holds snapshots and parity sweeps (never imported by the
runtime). ``graphrt.buffers`` and ``graphrt.capture`` know nothing of models or attention.
"""

import importlib.util as _util
import sys as _sys
from pathlib import Path as _Path

#: Top-level folders installed as ``graphrt.<name>`` (``package-dir`` in pyproject.toml).
_MAPPED = ("buffers", "capture", "tools")


def _map_checkout() -> None:
    """Make ``graphrt.buffers`` / ``.capture`` / ``.tools`` importable from a plain checkout.

    An install (wheel or editable) puts them under ``graphrt``; a checkout on ``PYTHONPATH``
    keeps them beside ``graphrt/``. The sibling folder wins whenever ``graphrt/<name>`` is
    absent, so a checkout is never shadowed by another install of graphrt.
    """
    here = _Path(__file__).resolve().parent
    for name in _MAPPED:
        folder, full = here.parent / name, f"{__name__}.{name}"
        if full in _sys.modules or (here / name).exists() or not (folder / "__init__.py").is_file():
            continue
        spec = _util.spec_from_file_location(
            full, folder / "__init__.py", submodule_search_locations=[str(folder)]
        )
        assert spec is not None and spec.loader is not None
        module = _util.module_from_spec(spec)
        _sys.modules[full] = module
        spec.loader.exec_module(module)
        globals()[name] = module


_map_checkout()

from graphrt.attention import ForwardContext
from graphrt.engine import Engine, EngineConfig, EngineStats
from graphrt.kv import KVShape, PagedKVCache, ReqToToken
from graphrt.llm import LLM
from graphrt.replies import Completion
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
    "LLM",
    "MODES",
    "Batch",
    "CaptureReport",
    "Completion",
    "Engine",
    "EngineConfig",
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
