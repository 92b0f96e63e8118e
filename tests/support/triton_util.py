"""Devices a Triton kernel test runs on: CUDA (marked ``gpu``), and the CPU when Triton's
interpreter is on (``TRITON_INTERPRET=1``, set before triton is first imported); a PDL chain's
graph replay against eager launches."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from collections.abc import Callable

import pytest
import torch

from graphrt.kernels.switches import triton

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"


def fix_interpreter_scalars() -> None:
    """Let Triton's interpreter take a loaded scalar as a loop bound under numpy >= 2.4.

    NOTE: Triton 3.6's interpreter turns a scalar tensor into an int with ``int(array)``, which
    numpy 2.4 refuses for the 1-element arrays it holds (``range(start, end)`` over a loaded
    length fails); later Triton squeezes the array first. This is the same fix, for any Triton.
    Applied by ``tests/conftest.py`` and when this module is imported: a script that runs a
    kernel under the interpreter without either fails in the first loop over a loaded bound
    (the split decode kernel's key loop: "only 0-dimensional arrays can be converted to Python
    scalars"), whatever the batch.
    """
    if triton is None or not INTERPRET:
        return
    from triton.runtime import interpreter

    original = interpreter._patch_lang_tensor
    if getattr(original, "scalar_fix", False):
        return

    def patched(tensor: object, scope: object) -> None:
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.item()))  # type: ignore[attr-defined]

    patched.scalar_fix = True  # type: ignore[attr-defined]
    interpreter._patch_lang_tensor = patched


fix_interpreter_scalars()


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


def replay_matches_eager(
    run: Callable[[bool], torch.Tensor | tuple[torch.Tensor, ...]], x: torch.Tensor
) -> None:
    """Capture ``run(True)`` (launches with PDL, reading ``x``) in a CUDA graph; for three new
    values of ``x`` its replay must equal ``run(False)`` (eager, no PDL) bit for bit."""
    device = x.device
    gen = torch.Generator(device)
    stream = torch.cuda.Stream(device)
    with torch.cuda.stream(stream):
        run(True)  # NOTE: compiles outside the capture
    torch.cuda.synchronize(device)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        out = run(True)
    for seed in range(3):
        x.copy_(torch.randn(x.shape, device=device, generator=gen.manual_seed(100 + seed)))
        graph.replay()
        want = run(False)
        torch.cuda.synchronize(device)
        pairs = zip(*((t,) if isinstance(t, torch.Tensor) else t for t in (out, want)), strict=True)
        assert all(torch.equal(a, b) for a, b in pairs), f"replay {seed} differs from eager"


#: What ptxas prints for a kernel that spills no register.
NO_SPILLS = " 0 bytes spill stores, 0 bytes spill loads"


def sm90_ptx(fn, signature: dict, constexprs: dict, options: dict, attrs: dict | None = None) -> str:
    """``fn`` (a ``triton.jit`` function) compiled to PTX for sm_90 by Triton's CUDA compiler, no
    GPU needed; ``signature``: every argument's type (``"*bf16"``, ``"i32"``, ``"constexpr"``)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    source = ASTSource(fn=fn, signature=signature, constexprs=constexprs, attrs=attrs)
    return triton.compile(source, target=GPUTarget("cuda", 90, 32), options=options).asm["ptx"]


def ptxas_report(ptx: str) -> str:
    """``ptxas -v -arch=sm_90a`` on ``ptx`` with Triton's bundled ptxas: registers and spills."""
    from triton.backends.nvidia.compiler import get_ptxas

    with tempfile.NamedTemporaryFile("w", suffix=".ptx") as f:
        f.write(ptx)
        f.flush()
        done = subprocess.run([get_ptxas(90).path, "-v", "-arch=sm_90a", f.name, "-o", "/dev/null"],
                              capture_output=True, text=True, check=True)  # fmt: skip
    return done.stderr
