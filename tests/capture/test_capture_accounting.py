"""Capture accounting: pool bytes from the allocator (never negative, summing to the pool's
growth) and capture seconds split into warm-up, recording and instantiation."""

from __future__ import annotations

import gc

import pytest
import torch

from tests.support.util import build_runtime


def test_emulated_split() -> None:
    setup = build_runtime(torch.device("cpu"), max_batch_size=2, buckets=(1, 2))
    for g in setup.runtime.dispatcher.graphs.values():
        assert g.info.pool_bytes >= 0 and g.info.warmup_seconds > 0
        assert g.info.instantiate_seconds == 0.0 and g.info.capture_seconds > 0


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA")
def test_cuda_pool_bytes_sum_to_growth() -> None:
    dev = torch.device("cuda")
    warm = build_runtime(dev, max_batch_size=4, buckets=(1, 2, 4))  # lazy CUDA/cuBLAS state first
    del warm
    # NOTE: the runtime holds reference cycles; collected later, inside the measured build, its
    # memory would be released there and the growth understated (seen on an H200: 2 of 4 MiB).
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    before = torch.cuda.memory_stats(dev)["reserved_bytes.all.current"]
    setup = build_runtime(dev, max_batch_size=4, buckets=(1, 2, 4))
    torch.cuda.empty_cache()
    growth = torch.cuda.memory_stats(dev)["reserved_bytes.all.current"] - before
    infos = [g.info for g in setup.runtime.dispatcher.graphs.values()]
    assert all(i.pool_bytes >= 0 for i in infos)
    total = sum(i.pool_bytes for i in infos)
    assert 0 < total <= growth  # the rest of the growth: static buffers, weights, KV cache
    for i in infos:
        assert i.warmup_seconds > 0 and 0 < i.instantiate_seconds < i.capture_seconds
