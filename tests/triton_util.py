"""Devices a Triton kernel test runs on: CUDA (marked ``gpu``), and the CPU when Triton's
interpreter is on (``TRITON_INTERPRET=1``, set before triton is first imported)."""

from __future__ import annotations

import os
import subprocess
import sys

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


#: For a CPU box: a test file's Triton cases run again by the interpreter, in a child process.
rerun_marks = pytest.mark.skipif(
    INTERPRET or torch.cuda.is_available() or triton is None, reason="runs itself (CUDA or interpreter)"
)


def rerun_under_interpreter(path: str, passed: int) -> None:
    """Run the test file ``path`` with ``TRITON_INTERPRET=1``; assert ``passed`` tests pass."""
    env = dict(os.environ, TRITON_INTERPRET="1")
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", path],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    last = done.stdout.strip().splitlines()[-1]
    assert f"{passed} passed" in last, last
