"""On the GPU (skipped without CUDA): the same greedy tokens with and without prefix caching
(an FP8 cache: the same up to a near-tie), and with and without chunked prefill, graphed,
tiny-llama in fp32 (bf16 could flip a near-tied argmax between kernels)."""

from __future__ import annotations

import pytest
import torch

from graphrt import Engine, SamplingParams
from tests.engine.test_chunked_prefill import BUDGETS, PROMPTS
from tests.engine.test_prefix_caching import FIRST, LATER

KW = {"device": "cuda", "max_batch_size": 4, "buckets": (1, 2, 4), "max_context_len": 256}
#: Log-probabilities of a cached and an uncached FP8 prefill agree within this (nats), and a token
#: may differ only where the top two are closer than twice it: FP8 rounds each key to a step of
#: 1/16 of its magnitude, so a last-bit difference between FA3's calls over a prompt and over its
#: uncached rest flips roundings (a hit and a miss run other shapes), and tiny-llama's random
#: weights leave near-ties.
FP8_NATS = 0.05


def _requests(caching: bool, kv: str | None) -> list:
    engine = Engine(
        "tiny-llama", **KW, dtype=torch.float32, kv_cache_dtype=kv, prefix_caching=caching, max_logprobs=2
    )
    reqs = []
    for prompts in (FIRST, LATER):
        rids = [engine.add_request(p, 8, SamplingParams(logprobs=2)) for p in prompts]
        while engine.waiting or engine.running:
            engine.step()
        reqs += [engine.scheduler.find(r) for r in rids]
    engine.close()
    return reqs


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA")
def test_prefix_caching_tokens_on_the_gpu() -> None:
    cold, cached = (_requests(c, None) for c in (False, True))
    assert [r.output for r in cached] == [r.output for r in cold]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA")
def test_fp8_prefix_caching_agrees_up_to_a_near_tie() -> None:
    cold, cached = (_requests(c, "fp8_e4m3") for c in (False, True))
    for i, (a, b) in enumerate(zip(cold, cached, strict=True)):
        assert len(a.logprobs) == len(b.logprobs) == 8, i
        for step, (x, y) in enumerate(zip(a.logprobs, b.logprobs, strict=True)):
            assert x.top_logprobs == pytest.approx(y.top_logprobs, abs=FP8_NATS), (i, step)
            if x.token != y.token:  # NOTE: from here on the two continue other texts
                assert x.top_logprobs[0] - x.top_logprobs[1] < 2 * FP8_NATS, (i, step)
                break


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
