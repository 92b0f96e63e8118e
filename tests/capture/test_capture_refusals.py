"""The emulated engine refuses what a CUDA stream capture refuses, naming the operation."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from graphrt.capture import CaptureSyncError, EmulatedEngine
from tests.support.capture_ops import ALLOWED, DEVICE_ONLY, REFUSED, Inputs

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", list(REFUSED))
def test_emulated_capture_refuses(device: torch.device, name: str) -> None:
    if name in DEVICE_ONLY and device.type == "cpu":
        pytest.skip(f"{name} copies to the host only from a GPU")
    if name == "numpy" and device.type == "cuda":
        pytest.skip("torch refuses .numpy() of a CUDA tensor itself (TypeError), capture or not")
    fn, op = REFUSED[name]
    t = Inputs.on(device)
    fn(t)  # NOTE: fine eagerly (warm-up runs outside the capture)
    with pytest.raises(CaptureSyncError, match=rf"({op}).*cannot be captured"):
        EmulatedEngine().capture(name, lambda: fn(t), warmup=1)


@pytest.mark.parametrize("name", list(ALLOWED))
def test_emulated_capture_accepts(device: torch.device, name: str) -> None:
    t = Inputs.on(device)
    graph, out = EmulatedEngine().capture(name, lambda: ALLOWED[name](t), warmup=0)
    t.x.add_(1)  # replay sees the new input, like a CUDA graph
    graph.replay()
    assert torch.equal(out, ALLOWED[name](t))


def test_to_the_own_cpu_device_is_not_a_copy() -> None:
    """On the CPU ``x.to(y.device)`` stays on the device (a no-op on a GPU too); only a
    literal ``"cpu"`` or a move off a device is a host transfer."""
    x = torch.ones(3)
    graph, out = EmulatedEngine().capture("own", lambda: x.to(torch.device("cpu")) * 2, warmup=0)
    graph.replay()
    assert out.tolist() == [2.0, 2.0, 2.0]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA")
@pytest.mark.parametrize("name", [*REFUSED, *ALLOWED])
def test_cuda_capture_agrees(name: str) -> None:
    """The same snippet fails (or passes) under a real CUDA stream capture as under emulation."""
    env = os.environ | {"PYTHONPATH": str(ROOT)}
    run = subprocess.run(
        [sys.executable, "-m", "tests.support.capture_ops", name],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.split()[-1] == ("refused" if name in REFUSED else "ok")
