"""The window pool's bytes: the bench's arithmetic equals the cache a stack allocates, and the
savings it reports for ``tiny-llama-swa`` and a Gemma-2-like shape at 32k context."""

from __future__ import annotations

import torch

from graphrt import RuntimeConfig
from graphrt.engine.stack import build_stack
from graphrt.tools.bench.window_pool import GEMMA2_9B, TINY_SWA, pool_bytes


def test_bytes_match_the_allocated_caches() -> None:
    config = RuntimeConfig(max_batch_size=4, max_context_len=96, page_size=4, backend="reference")
    full, pooled = (
        build_stack("tiny-llama-swa", torch.device("cpu"), config, max_reqs=4, window_pool=p).kv.nbytes
        for p in (False, True)
    )
    assert pool_bytes(TINY_SWA, context=96, max_reqs=4, page_size=4) == (full, pooled)
    assert pooled < full


def test_gemma2_like_savings_at_32k() -> None:
    full, pooled = pool_bytes(GEMMA2_9B, context=32768, max_reqs=64, page_size=16)
    assert full == 42 * 2 * 8 * 256 * 2 * (64 * 2048 + 1) * 16
    # NOTE: window layers keep 64 x (4096 + 1) positions + one 32k prefill instead of 64 x 32k.
    assert 0.42 < 1 - pooled / full < 0.44
    small_prefill = pool_bytes(GEMMA2_9B, context=32768, max_reqs=64, page_size=16, prefill_tokens=8192)[1]
    assert 0.434 < 1 - small_prefill / full < 0.436
