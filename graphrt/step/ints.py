"""Strict integers at the public door: token ids and counts are ints, and nothing else is.

``Engine.generate``, ``Batch.create``, ``SamplingParams`` and the CLI's prompt files share
these checks. A string, a float or a bool is refused with a ``TypeError`` naming the argument
and the index, never converted: ``int("7")``, ``int(2.9)`` and ``int(True)`` all "work", and a
prompt ``"123"`` would silently become the ids 1, 2, 3. Python and numpy integers, and integer
arrays (numpy, torch), are ints here; ``bool`` and ``numpy.bool_`` are not.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def is_int(value: object) -> bool:
    """True for a Python or numpy integer (not a bool)."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def count(name: str, value: object) -> int:
    """``value`` as a Python int; ``TypeError`` naming ``name`` when it is not an integer."""
    if not is_int(value):
        raise TypeError(f"{name} is {value!r} ({type(value).__name__}): must be an int")
    return int(value)  # type: ignore[call-overload]


def token_ids(value: object, name: str = "prompt") -> list[int]:
    """``value`` as a list of Python ints: a sequence of integers or a 1-D integer array (numpy,
    torch), never a string, a float or a bool (``TypeError`` naming ``name`` and the index)."""
    if isinstance(value, (str, bytes)):
        raise TypeError(f"{name} is a {type(value).__name__}; token ids are a sequence of integers")
    if hasattr(value, "tolist") and not isinstance(value, (list, tuple)):
        value = value.tolist()  # NOTE: numpy arrays and tensors; a float array gives floats
    if not isinstance(value, Sequence):
        raise TypeError(f"{name} must be a sequence of integer token ids, got {type(value).__name__}")
    bad = first_non_int(value)
    if bad >= 0:
        v = value[bad]
        raise TypeError(f"{name}[{bad}] is {v!r} ({type(v).__name__}): token ids must be integers")
    return [int(t) for t in value]


def first_non_int(value: object) -> int:
    """Index of the first element of a list or tuple that is not an integer (bools included),
    or -1 (also for anything else). ``np.asarray([1, True])`` is an int64 array and
    ``np.asarray([1, 2.0])`` a float one: the elements are checked as given."""
    if isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            if not is_int(v):
                return i
    return -1
