"""Proposer speculation on CUDA: captured graphs, the fused sampler drawing every verify node."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from graphrt import Engine, SamplingParams
from graphrt.metadata.sampling import sampling_inputs
from graphrt.runtime.verify_sampler import sample_nodes

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA")]

PROMPTS = [[5, 6, 7, 8] * 4, [9, 3, 9, 3, 9], [1, 2, 3, 4, 1, 2], [300, 200, 100]]
PARAMS = [SamplingParams(temperature=0.5, top_p=0.9, seed=s) if s % 2 else SamplingParams() for s in range(4)]
KW = {"device": "cuda", "max_batch_size": 4, "max_context_len": 128, "dtype": torch.float32}


@pytest.mark.parametrize("spec", [{"method": "ngram"}, {"method": "suffix", "topk": 2, "min_match": 1}])
def test_graphed_tokens_equal_plain_decoding_fp32(spec: dict[str, object]) -> None:
    plain = Engine("tiny-llama", **KW)
    reference = plain.generate(PROMPTS, 24, PARAMS)
    engine = Engine("tiny-llama", speculative={"num_steps": 4, **spec}, **KW)
    assert engine.generate(PROMPTS, 24, PARAMS) == reference
    stats = engine.stats()
    assert stats.fallbacks == {} and stats.verify_steps > 0
    assert set(stats.replays) >= {"TARGET_VERIFY"}


def test_fused_node_draws_equal_the_torch_sampler() -> None:
    logits = torch.randn(64 * 3, 4096, generator=torch.Generator().manual_seed(0))
    params = [dataclasses.replace(PARAMS[1], seed=r) for r in range(64)]
    positions = torch.arange(64 * 3) % 3 + 17
    drawn = {}
    for device in ("cpu", "cuda"):
        buffers = sampling_inputs(params, [0] * 64, torch.device(device))
        drawn[device] = sample_nodes(logits.to(device), buffers, positions.to(device), nodes=3).cpu()
    # NOTE: exp/log may differ in the last bit between libraries: a near-tie may flip
    assert (drawn["cpu"] == drawn["cuda"]).float().mean().item() > 0.99


@pytest.mark.parametrize("method", ["ngram", "suffix"])
def test_overlapped_rounds_equal_synchronous_ones_fp32(method: str) -> None:
    """Overlapped rounds (engine/spec_ahead.py) on CUDA graphs: the synchronous run's tokens,
    greedy and seeded, with stale rows dropped on the way."""
    runs = {}
    for overlap in (False, None):
        e = Engine("tiny-llama", overlap=overlap, speculative={"method": method, "num_steps": 4}, **KW)
        runs[overlap] = (e.generate(PROMPTS, 24, PARAMS), e.generate(PROMPTS, 24), e.stats())
    assert runs[False][:2] == runs[None][:2]
    sync, ahead = runs[False][2], runs[None][2]
    assert ahead.spec_overlap and not sync.spec_overlap and ahead.fallbacks == {}
    assert ahead.verify_steps > 0 and ahead.drafts_accepted > 0
