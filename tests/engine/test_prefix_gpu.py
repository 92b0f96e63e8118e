"""On the GPU (skipped without CUDA): the same greedy tokens with and without prefix caching,
and with and without chunked prefill, graphed, tiny-llama in fp32 (bf16 could flip a near-tied argmax between kernels)."""

from __future__ import annotations

import pytest
import torch

from graphrt import Engine
from tests.engine.test_chunked_prefill import BUDGETS, PROMPTS
from tests.engine.test_prefix_caching import FIRST, LATER

KW = {"device": "cuda", "max_batch_size": 4, "buckets": (1, 2, 4), "max_context_len": 256}


@pytest.mark.parametrize("kv", [None, "fp8_e4m3"], ids=["fp32-kv", "fp8-kv"])
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA")
def test_prefix_caching_tokens_on_the_gpu(kv: str | None) -> None:
    outs = {}
    for caching in (False, True):
        # NOTE: an FP8 cache rounds each key to a step of its grid, so a last-bit difference between
        # the GEMMs of a prefix computed at another length flips a rounding: batch-invariant kernels
        # make the prefix's keys the same bits either way
        engine = Engine(
            "tiny-llama",
            **KW,
            dtype=torch.float32,
            kv_cache_dtype=kv,
            prefix_caching=caching,
            deterministic=kv is not None,
        )
        outs[caching] = engine.generate(FIRST, 8) + engine.generate(LATER, 8)
        engine.close()
    assert outs[True] == outs[False]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA")
def test_chunked_prefill_tokens_on_the_gpu() -> None:
    outs = {}
    for chunk in (None, 16):
        engine = Engine("tiny-llama", **KW, dtype=torch.float32, prefill_chunk=chunk)
        outs[chunk] = engine.generate(PROMPTS, BUDGETS)
        if chunk:
            assert engine.stats().mixed_steps > 0
        engine.close()
    assert outs[16] == outs[None]
