"""Reductions and constants of the per-step host checks, with the numpy call overhead cut.

Shared by ``step.checks``, ``kv.ledger`` and ``metadata.step``: each runs every step, where
numpy's Python-level reduction wrappers (``max``, ``any``, ``count_nonzero``) cost more than
the work on a few hundred elements.
"""

from __future__ import annotations

import numpy as np


def umax(arr: np.ndarray) -> int:
    """``int(arr.max())`` of a non-empty 1-D array: ``argmax`` is a C method, ``max`` goes through
    numpy's Python-level reduction wrapper (slower per call, measured: docs/performance.md)."""
    return arr.item(arr.argmax())  # NOTE: item() gives a Python int, cheaper than int(arr[i])


def umin(arr: np.ndarray) -> int:
    """``int(arr.min())`` of a non-empty 1-D array (see :func:`umax`)."""
    return arr.item(arr.argmin())


def any_true(mask: np.ndarray) -> bool:
    """``mask.any()`` of a 1-D bool (or non-negative int) array: ``argmax`` finds the first
    nonzero in C, where ``any`` and ``np.count_nonzero`` pass through Python-level wrappers."""
    return mask.size > 0 and bool(mask.item(mask.argmax()))


def arange(n: int) -> np.ndarray:
    """``np.arange(n)`` int64, a read-only view of one shared array up to 65536 (no allocation)."""
    return _ARANGE[:n] if n <= _ARANGE.size else np.arange(n, dtype=np.int64)


_ARANGE = np.arange(1 << 16, dtype=np.int64)
_ARANGE.flags.writeable = False
