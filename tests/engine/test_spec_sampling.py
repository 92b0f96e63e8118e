"""Sampled verification: exact speculative sampling, checked against the target's own draws.

The verify draws the target's token at every node with the sampler's counter RNG; a draft is
accepted iff it equals the draw. With many seeds (one per row) the accepted share must be
``p(x)``, a rejected row's token ``p`` without ``x`` renormalised, an accepted row's next token
the next node's distribution, and the first tokens the distribution plain sampling draws.
``N`` rows put each frequency's standard error below 0.0025, so a 2 % shift is 8 of them.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from graphrt.metadata.sampling import sampling_inputs
from graphrt.runtime.sampler.draw import filtered_probs, sample
from graphrt.runtime.verify_sampler import sample_nodes
from graphrt.step.sampling import SamplingParams

N, V = 40_000, 8
TOLERANCE = 0.01  # 4 standard errors; a 2 % shift of any probability fails
LOGITS = torch.tensor(
    [[1.2, 0.3, -0.5, 2.0, 0.0, -1.0, 0.8, 0.1], [0.1, 1.5, 0.2, -0.3, 1.0, 0.4, -2.0, 0.9]]
)
PARAMS = SamplingParams(temperature=0.9, top_k=7, seed=0)
DRAFT = 0  # p(0) ~ 0.2: both outcomes frequent


def freq(tokens: torch.Tensor) -> np.ndarray:
    return np.bincount(tokens.numpy(), minlength=V) / max(tokens.numel(), 1)


def target(node: int) -> np.ndarray:
    """The target's distribution at ``node`` (the sampler's filtered softmax)."""
    inputs = sampling_inputs([PARAMS], [0], torch.device("cpu"))
    return filtered_probs(LOGITS[node : node + 1], inputs)[0].double().numpy()


@pytest.fixture(scope="module")
def draws() -> torch.Tensor:
    """``[N, 2]``: N requests (seed r, node 0 at position 10) verifying one draft each."""
    params = [dataclasses.replace(PARAMS, seed=r) for r in range(N)]
    buffers = sampling_inputs(params, [11] * N, torch.device("cpu"))
    positions = torch.tensor([10, 11]).repeat(N)
    return sample_nodes(LOGITS.repeat(N, 1), buffers, positions, nodes=2)


def test_acceptance_and_residual_follow_the_target(draws: torch.Tensor) -> None:
    p0, p1 = target(0), target(1)
    accepted = draws[:, 0] == DRAFT
    assert abs(accepted.double().mean().item() - p0[DRAFT]) < TOLERANCE
    residual = np.where(np.arange(V) == DRAFT, 0.0, p0) / (1 - p0[DRAFT])
    assert np.abs(freq(draws[~accepted, 0]) - residual).max() < TOLERANCE
    assert np.abs(freq(draws[accepted, 1]) - p1).max() < 2 * TOLERANCE  # ~N/5 rows
    assert (freq(draws[:, 0])[np.asarray(p0) == 0] == 0).all()  # top-k's cut token never drawn


def test_first_tokens_match_plain_sampling_of_the_target(draws: torch.Tensor) -> None:
    # the target's own sampling, other seeds: the same distribution
    params = [dataclasses.replace(PARAMS, seed=N + r) for r in range(N)]
    own = sample(LOGITS[:1].repeat(N, 1), sampling_inputs(params, [11] * N, torch.device("cpu")))
    assert np.abs(freq(draws[:, 0]) - freq(own)).max() < 1.5 * TOLERANCE
    assert np.abs(freq(own) - target(0)).max() < TOLERANCE
    # and for the same seed and position, the very same token (counter RNG)
    same = [dataclasses.replace(PARAMS, seed=r) for r in range(N)]
    plain = sample(LOGITS[:1].repeat(N, 1), sampling_inputs(same, [11] * N, torch.device("cpu")))
    assert torch.equal(plain, draws[:, 0])


def test_greedy_rows_take_the_argmax() -> None:
    buffers = sampling_inputs([SamplingParams()] * 3, [5] * 3, torch.device("cpu"))
    out = sample_nodes(LOGITS.repeat(3, 1), buffers, torch.arange(6), nodes=2)
    assert out.tolist() == [[3, 1]] * 3
