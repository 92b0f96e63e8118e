"""Errors a runtime step raises beyond ``ValueError`` for bad input."""

from __future__ import annotations


class GraphFallbackError(RuntimeError):
    """``strict=True`` and no captured graph fits the step."""


class HostScalarMismatch(RuntimeError):
    """A replay would need a host scalar other than the one frozen into the graph."""


class PoisonLeft(RuntimeError):
    """Debug mode: a buffer the replay read was not written by the update."""
