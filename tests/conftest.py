"""Every test that takes ``device`` runs on the CPU, and on CUDA when one is present.

Without CUDA the Triton kernels' tests run on the CPU through Triton's interpreter:
``TRITON_INTERPRET=1`` is set here, before anything imports triton (unless it is set already).
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # NOTE: read by triton at import: before graphrt's

import pytest

from graphrt.kernels import switches
from tests.support.triton_util import fix_interpreter_scalars

fix_interpreter_scalars()

DEVICES = [
    "cpu",
    pytest.param(
        "cuda",
        marks=[pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA")],
    ),
]


@pytest.fixture(params=DEVICES)
def device(request: pytest.FixtureRequest) -> torch.device:
    return torch.device(request.param)


@pytest.fixture(autouse=True, scope="session")
def _private_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Every test (and every process it starts) converts into a cache folder of this session,
    never the user's ``~/.cache/graphrt``."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("xdg-cache")))
        mp.delenv("GRAPHRT_CACHE", raising=False)
        mp.delenv("GRAPHRT_CACHE_MAX_GB", raising=False)
        yield


class SwitchPatch(pytest.MonkeyPatch):
    """``monkeypatch`` whose ``setenv`` / ``delenv`` make the process read its switches anew.

    The library reads the ``GRAPHRT_*`` switches once (:mod:`graphrt.kernels.switches`: when a
    runtime is built, else at first use); a test that sets one and then calls a kernel directly
    wants it read again at its next use, and read anew once the test undoes it.
    """

    def setenv(self, name: str, value: str, prepend: str | None = None) -> None:
        super().setenv(name, value, prepend)
        switches.forget()

    def delenv(self, name: str, raising: bool = True) -> None:
        super().delenv(name, raising)
        switches.forget()

    def undo(self) -> None:
        super().undo()
        switches.forget()


@pytest.fixture
def monkeypatch() -> Iterator[SwitchPatch]:
    """pytest's ``monkeypatch``, the switch record read anew after each environment change."""
    patch = SwitchPatch()
    yield patch
    patch.undo()


@pytest.fixture(autouse=True)
def _fresh_switches() -> Iterator[None]:
    """Each test starts from the environment's switches, not a record an earlier test read."""
    switches.forget()
    yield
    switches.forget()
