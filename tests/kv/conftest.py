"""The isolation tests' runtime: tiny-llama, pages of 16, 4 request rows, buckets 1 and 2."""

from __future__ import annotations

import pytest
import torch

from tests.support.util import Setup, build_runtime

PAGE, CONTEXT, ROWS = 16, 64, 4


@pytest.fixture
def setup(device: torch.device) -> Setup:
    return build_runtime(device, page_size=PAGE, max_context_len=CONTEXT, max_reqs=ROWS, buckets=(1, 2))
