"""Attention: kinds, forward contexts and backends (FA3, FlashMLA, torch reference).

Runs inside the graph. A kind (MHA/GQA or sparse MLA) is chosen from the KV-cache type;
its backend comes from the one registry in :mod:`graphrt.attention.registry`, preferred in
an explicit order; the context a model's forward receives stores K/V and calls the backend.
"""

from graphrt.attention import fa3, flashmla, mla, reference  # noqa: F401  (register the backends)
from graphrt.attention.base import AttentionBackend
from graphrt.attention.context import ContextInputs, ForwardContext, LocalStep, ScalarLog
from graphrt.attention.kinds import AttentionKind, attention_kind
from graphrt.attention.registry import PREFERENCE, available_backends, select_backend
from graphrt.attention.sparse_context import SparseMLAContext

__all__ = [
    "PREFERENCE",
    "AttentionBackend",
    "AttentionKind",
    "ContextInputs",
    "ForwardContext",
    "LocalStep",
    "ScalarLog",
    "SparseMLAContext",
    "attention_kind",
    "available_backends",
    "select_backend",
]
