"""Debug poison for every dtype: an unwritten buffer is reported, a written one is not."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
import torch

from graphrt.buffers import BufferSpec, Dims, PadRule, StaticBuffers
from graphrt.buffers.poison import POISON_BOOL_BYTE, poison_value, to_bits

DIMS = Dims(max_bs=4, max_tokens=8, max_pages=3, max_context_len=48)
DTYPES = [
    torch.int8,
    torch.uint8,
    torch.int16,
    torch.uint16,
    torch.int32,
    torch.uint32,
    torch.int64,
    torch.uint64,
    torch.float16,
    torch.bfloat16,
    torch.float32,
    torch.float64,
    torch.bool,
]
EXPECTED = {
    torch.int8: -128,
    torch.uint8: 255,
    torch.int16: -(2**15),
    torch.uint16: 2**16 - 1,
    torch.int32: -(2**31),
    torch.uint32: 2**32 - 1,
    torch.int64: -(2**63),
    torch.uint64: 2**64 - 1,
    torch.bool: POISON_BOOL_BYTE,
}


@dataclass(slots=True)
class Pair:
    written: torch.Tensor
    left: torch.Tensor


def pair(dtype: torch.dtype, host: bool, device: torch.device) -> StaticBuffers[Pair]:
    specs = [
        BufferSpec("written", ("max_bs", "max_pages"), dtype, PadRule("free"), host=host),
        BufferSpec("left", ("max_tokens",), dtype, PadRule("free"), host=host),
    ]
    return StaticBuffers("toy", specs, Pair, DIMS, device)


def write(buffers: StaticBuffers[Pair], dtype: torch.dtype, host: bool) -> None:
    """Write every element of ``written`` (a legitimate value: 1 / True / 0.5)."""
    value = True if dtype == torch.bool else (0.5 if dtype.is_floating_point else 1)
    if not host:
        buffers.view(DIMS.max_bs).written.fill_(value)
        return
    mirror = buffers.host("written")
    mirror[...] = to_bits(np.full(mirror.shape, value), dtype) if dtype == torch.bfloat16 else value
    buffers.upload()


@pytest.mark.parametrize("host", [False, True], ids=["device", "host"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_unwritten_buffer_is_reported(device: torch.device, dtype: torch.dtype, host: bool) -> None:
    buffers = pair(dtype, host, device)
    buffers.poison()
    assert buffers.poisoned(DIMS.max_bs) == ["written", "left"]
    write(buffers, dtype, host)
    assert buffers.poisoned(DIMS.max_bs) == ["left"]
    written = buffers.view(DIMS.max_bs).written
    expected = torch.full_like(
        written, True if dtype == torch.bool else (0.5 if dtype.is_floating_point else 1)
    )
    assert torch.equal(written, expected)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_poison_values(dtype: torch.dtype) -> None:
    """The dtype's min (signed) or max (unsigned), NaN for floats, 0xFF bytes for bool."""
    buffers = pair(dtype, True, torch.device("cpu"))
    buffers.poison()
    device_left = buffers.full["left"]
    if dtype.is_floating_point:
        assert np.isnan(poison_value(dtype)) and device_left.isnan().all()
        assert torch.isnan(torch.from_numpy(buffers.host("left")).view(dtype)).all()
        return
    assert poison_value(dtype) == EXPECTED[dtype]
    raw = device_left.view(torch.uint8) if dtype == torch.bool else device_left
    assert (raw == EXPECTED[dtype]).all()
    host = buffers.host("left")
    assert (host.view(np.uint8) if dtype == torch.bool else host).tolist() == [EXPECTED[dtype]] * host.size


def test_one_poisoned_bool_element_is_enough() -> None:
    """A bool write stores 0 or 1, so one element left at 0xFF keeps the buffer listed."""
    buffers = pair(torch.bool, False, torch.device("cpu"))
    buffers.poison()
    left = buffers.view(DIMS.max_bs).left
    left[:-1] = False
    assert buffers.poisoned(DIMS.max_bs) == ["written", "left"]
    left[-1] = True
    assert buffers.poisoned(DIMS.max_bs) == ["written"]


def test_bf16_host_mirror_holds_raw_bits() -> None:
    buffers = pair(torch.bfloat16, True, torch.device("cpu"))
    mirror = buffers.host("left")
    assert mirror.dtype == np.uint16
    mirror[:3] = to_bits(np.array([1.0, -2.5, 3.140625]), torch.bfloat16)
    buffers.upload()
    assert buffers.full["left"][:3].tolist() == [1.0, -2.5, 3.140625]
