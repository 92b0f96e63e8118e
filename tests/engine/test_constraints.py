"""Constrained decoding in the engine: each request's allowed-token mask, written before the
steps that sample for it, holds its tokens inside the allowed set, graphed or eager, overlapped
or not, alone or batched with unconstrained requests (which it leaves untouched).

The constraint here is a token-set rule written out by hand (the engine's contract:
``fill(bitmask, index)`` writing row ``index`` of ``[n, words]`` int32, ``accept(output)``); a grammar (xgrammar) is one through the
server's tests.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from graphrt import Engine, SamplingParams

KW = {"device": "cpu", "max_batch_size": 4, "max_context_len": 64, "buckets": (1, 2, 4)}
PROMPTS = [np.random.default_rng(20 + i).integers(0, 512, n).tolist() for i, n in enumerate((5, 8, 3))]


class Stepwise:
    """Token ``i`` of the output must lie in ``allowed[i % len(allowed)]`` (sets of ids)."""

    def __init__(self, vocab: int, allowed: list[set[int]]) -> None:
        self.vocab, self.allowed, self.accepted = vocab, allowed, 0

    def fill(self, bitmask: torch.Tensor, index: int) -> None:
        bits = np.zeros((self.vocab + 31) // 32, dtype=np.int64)
        for j in self.allowed[self.accepted % len(self.allowed)]:
            bits[j // 32] |= 1 << (j % 32)
        bitmask[index] = torch.from_numpy(bits.astype(np.uint32).view(np.int32))

    def accept(self, output: list[int]) -> None:
        for i in range(self.accepted, len(output)):
            assert output[i] in self.allowed[i % len(self.allowed)], (i, output)
        self.accepted = len(output)


@pytest.mark.parametrize(("graphs", "overlap"), [(True, True), (True, False), (False, True)])
def test_constrained_requests_sample_only_allowed_tokens(graphs: bool, overlap: bool) -> None:
    engine = Engine(use_graphs=graphs, overlap=overlap, token_masks=True, **KW)
    vocab = engine.model.vocab_size
    free = engine.generate(PROMPTS, 6)
    sets = [{7, 300, 9}, set(range(100, 140)), {vocab - 1}]
    rules = [Stepwise(vocab, sets), Stepwise(vocab, sets[1:]), None]
    sampled = SamplingParams(temperature=1.0, seed=3)
    rids = [
        engine.add_request(p, 6, sampled if i == 1 else None, constraint=c)
        for i, (p, c) in enumerate(zip(PROMPTS, rules, strict=True))
    ]
    reqs = [engine.scheduler.find(r) for r in rids]
    while engine.waiting or engine.running:
        engine.step()
    for i, (r, rule) in enumerate(zip(reqs, rules, strict=True)):
        assert len(r.output) == 6
        if rule is None:
            assert r.output == free[i]  # NOTE: an unconstrained row is untouched
        else:
            assert rule.accepted == 6 and all(
                t in rule.allowed[k % len(rule.allowed)] for k, t in enumerate(r.output)
            )
    assert engine.generate(PROMPTS, 6) == free  # NOTE: reused rows are all-allowed again


def test_a_constraint_needs_an_engine_with_masks() -> None:
    engine = Engine(use_graphs=False, **KW)
    with pytest.raises(ValueError, match="token_masks"):
        engine.add_request([1, 2], 2, constraint=Stepwise(engine.model.vocab_size, [{1}]))
