"""Strict integers at the public door: token ids and counts are ints, and nothing else is.

A string, a float, a bool or a float array is refused with a ``TypeError`` naming the argument
and the index, never converted: ``int("7")``, ``int(2.9)`` and ``int(True)`` all "work", and a
prompt ``"123"`` would silently become the ids 1, 2, 3. Numpy integer scalars and integer
arrays (numpy, or CPU torch tensors) are ints here; ``bool`` and ``numpy.bool_`` are not.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch


def is_int(value: Any) -> bool:
    """True for a Python or numpy integer (not a bool)."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def count(name: str, value: Any) -> int:
    """``value`` as a Python int; ``TypeError`` naming ``name`` when it is not an integer."""
    if not is_int(value):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    return int(value)


def int_list(name: str, value: Any) -> list[int]:
    """A sequence of integers (list, tuple, 1-D integer array or CPU tensor) as Python ints.

    ``TypeError`` naming ``name`` and the index of the first element that is not an integer,
    or ``name`` alone when ``value`` is not such a sequence (a string, a number, a 2-D array).
    """
    if isinstance(value, torch.Tensor):
        if value.device.type != "cpu":
            raise TypeError(f"{name} must be on the CPU (host token ids), got a tensor on {value.device}")
        value = value.numpy()
    if isinstance(value, np.ndarray):
        if value.ndim != 1 or (value.size and value.dtype.kind not in "iu"):
            raise TypeError(f"{name} must be a 1-D array of integers, got {value.ndim}-D dtype {value.dtype}")
        return [int(v) for v in value.tolist()]
    if not isinstance(value, (list, tuple)):
        raise TypeError(
            f"{name} must be a list of int token ids (or a 1-D integer array), got {type(value).__name__}"
        )
    for i, v in enumerate(value):
        if not is_int(v):
            raise TypeError(f"{name}[{i}] must be an int, got {type(v).__name__} {v!r}")
    return [int(v) for v in value]


def first_non_int(value: Any) -> int:
    """Index of the first element of a list or tuple that is not an integer (bools included),
    or -1: ``np.asarray([1, True])`` is an int64 array, so the elements are checked as given."""
    if isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            if not is_int(v):
                return i
    return -1
