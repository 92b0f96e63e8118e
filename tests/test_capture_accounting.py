"""Capture accounting: pool bytes from the allocator (never negative, summing to the pool's
growth) and capture seconds split into warm-up, recording and instantiation."""

from __future__ import annotations

import pytest
import torch

from tests.util import build_runtime


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


def blas_workspace_survives_clear(dev: torch.device) -> None:
    """A captured GEMM keeps computing the same thing, and writes nothing outside its own
    memory, after cuBLAS's workspaces are cleared (``torch.compile``'s CUDA graph trees clear
    them before and after each recording) and the freed memory is handed out again."""
    from graphrt.capture.cuda import CudaEngine

    gen = torch.Generator(device=dev).manual_seed(0)
    x = torch.randn(1, 8192, device=dev, dtype=torch.bfloat16, generator=gen)
    w = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16, generator=gen)
    graph, out = CudaEngine(dev, record_kernels=False).capture("gemv", lambda: x @ w, warmup=1)
    expect = (x @ w).clone()
    torch._C._cuda_clearCublasWorkspaces()
    fills = [torch.full((1 << 20,), 7.0, device=dev) for _ in range(32)]  # 128 MiB of 7s
    for _ in range(3):
        graph.replay()
    torch.cuda.synchronize(dev)
    clobbered = [i for i, f in enumerate(fills) if not bool((f == 7.0).all())]
    assert not clobbered, f"graph replays wrote into freed-then-reused memory: chunks {clobbered}"
    torch.testing.assert_close(out, expect, atol=0, rtol=0)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA")
def test_cuda_graph_survives_cleared_blas_workspace() -> None:
    blas_workspace_survives_clear(torch.device("cuda"))
