"""``buffers.stream.current_stream``: the stream ``torch.cuda.current_stream`` names, cached."""

from __future__ import annotations

import pytest
import torch

from graphrt.buffers.stream import current_stream

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA"),
]


def test_follows_the_current_stream() -> None:
    dev = torch.device("cuda")
    assert current_stream(dev) == torch.cuda.current_stream(dev)
    side = torch.cuda.Stream(dev)
    with torch.cuda.stream(side):
        assert current_stream(dev) == side
        assert current_stream(torch.device("cuda", torch.cuda.current_device())) == side
    assert current_stream(dev) == torch.cuda.current_stream(dev)
