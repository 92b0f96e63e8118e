"""Devices a Triton kernel test runs on: CUDA (marked ``gpu``), and the CPU when Triton's
interpreter is on (``TRITON_INTERPRET=1``, set before triton is first imported)."""

from __future__ import annotations

import os

import pytest
import torch

from graphrt.step.switches import triton

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"


def triton_devices() -> list:
    """``parametrize`` values: CUDA when present, the CPU under the interpreter; else one skip."""
    out = []
    if torch.cuda.is_available():
        out.append(pytest.param(torch.device("cuda"), marks=pytest.mark.gpu))
    if INTERPRET and triton is not None:
        out.append(torch.device("cpu"))
    return out or [
        pytest.param(torch.device("cpu"), marks=pytest.mark.skip(reason="no CUDA, no TRITON_INTERPRET"))
    ]
