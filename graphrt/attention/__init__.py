"""Attention: kinds, forward contexts and backends (FA3, FlashMLA, torch reference).

Runs inside the graph. A kind (MHA/GQA, dense MLA or sparse MLA) is chosen from the KV-cache type;
its backend comes from the one table in :mod:`graphrt.attention.registry` (``"module:Class"``
rows, preferred in order, loaded lazily); the context a model's forward receives stores K/V,
runs the backend's plan once per forward and calls the backend per layer.
"""

from graphrt.attention.base import AttentionBackend, Backend, BufferGroup
from graphrt.attention.call import AttendCall
from graphrt.attention.capabilities import ALL_MODES, REQUEST_MODES, GraphSupport, Needs
from graphrt.attention.context import ContextInputs, CrossStep, ForwardContext, LocalStep, ScalarLog
from graphrt.attention.kinds import AttentionKind, attention_kind
from graphrt.attention.mla_context import MLAContext
from graphrt.attention.registry import BACKENDS, add_backend, available_backends, select_backend
from graphrt.attention.sparse_context import SparseMLAContext

__all__ = [
    "ALL_MODES",
    "BACKENDS",
    "REQUEST_MODES",
    "AttendCall",
    "AttentionBackend",
    "AttentionKind",
    "Backend",
    "BufferGroup",
    "ContextInputs",
    "CrossStep",
    "ForwardContext",
    "GraphSupport",
    "LocalStep",
    "MLAContext",
    "Needs",
    "ScalarLog",
    "SparseMLAContext",
    "add_backend",
    "attention_kind",
    "available_backends",
    "select_backend",
]
