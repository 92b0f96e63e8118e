"""Attention backends. Import order is preference order: FA3 first, then the reference."""

from graphrt.attention import fa3, reference  # noqa: F401  (registers the backends)
from graphrt.attention.base import AttentionBackend, available_backends, select_backend

__all__ = ["AttentionBackend", "available_backends", "select_backend"]
