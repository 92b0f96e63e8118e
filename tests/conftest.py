"""Every test that takes ``device`` runs on the CPU, and on CUDA when one is present."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

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
