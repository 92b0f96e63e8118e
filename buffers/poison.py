"""Debug poison per dtype, and numpy host mirrors for every dtype (bf16 as raw bits).

Poison is a value no update writes: the dtype's minimum for signed ints, its maximum for
unsigned ints, NaN for floats. A bool holds no spare value, so a bool buffer is poisoned
through its bytes: a ``uint8`` shadow view of the same memory is filled with ``0xFF``, which
no bool write produces (writes store ``0`` or ``1``), and read back through that view.
"""

from __future__ import annotations

import numpy as np
import torch

#: Byte pattern of a poisoned bool element (a bool write stores 0 or 1).
POISON_BOOL_BYTE = 0xFF
#: dtypes whose host mirror holds raw bits (numpy has no such dtype).
RAW_BITS = {torch.bfloat16: torch.uint16}


def poison_value(dtype: torch.dtype) -> int | float:
    """NaN for floats; min for signed ints, max for unsigned; ``0xFF`` bytes for bool."""
    if dtype == torch.bool:
        return POISON_BOOL_BYTE
    if dtype.is_floating_point:
        return float("nan")
    info = torch.iinfo(dtype)
    return info.min if info.min < 0 else info.max


def shadow(t: torch.Tensor) -> torch.Tensor:
    """The tensor poison is written to and read from: bool → its ``uint8`` bytes."""
    return t.view(torch.uint8) if t.dtype == torch.bool else t


def fill_poison(t: torch.Tensor) -> None:
    shadow(t).fill_(poison_value(t.dtype))


def poisoned_mask(t: torch.Tensor) -> torch.Tensor:
    """Elements of ``t`` still holding poison (bool, same shape)."""
    if t.is_floating_point():
        return t.isnan()
    return shadow(t) == poison_value(t.dtype)


def host_mirror(t: torch.Tensor) -> np.ndarray:
    """A numpy view of host tensor ``t``; bf16 as ``uint16`` raw bits (see :func:`to_bits`)."""
    raw = RAW_BITS.get(t.dtype)
    return t.view(raw).numpy() if raw is not None else t.numpy()


def fill_host_poison(arr: np.ndarray, dtype: torch.dtype) -> None:
    """Poison a host mirror of a ``dtype`` buffer (raw bits for bf16, bytes for bool)."""
    if dtype == torch.bool:
        arr.view(np.uint8).fill(POISON_BOOL_BYTE)
    elif dtype in RAW_BITS:
        arr.fill(int(to_bits(np.array(np.nan), dtype)))
    else:
        arr.fill(poison_value(dtype))


def to_bits(values: np.ndarray, dtype: torch.dtype) -> np.ndarray:
    """``values`` rounded to ``dtype`` (bf16), as the raw bits its host mirror holds."""
    t = torch.from_numpy(np.asarray(values, dtype=np.float32)).to(dtype)
    return t.view(RAW_BITS[dtype]).numpy()
