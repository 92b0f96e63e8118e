"""Presence, frequency and repetition penalties in the graphed sampler, checked by hand.

The reference is an unpenalised greedy engine that records each step's logits ``L1, L2``; the
expected first token of a repetition-penalised request, and the expected second token of a
presence- or frequency-penalised one, are computed here from those logits and the definitions
(:mod:`graphrt.runtime.penalties`). The penalised engine (graphs, overlap) gives them alone and
batched together, rows reused (the counts start over at each prefill).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from graphrt import Engine, SamplingParams
from tests.conftest import DEVICES

KW = {"max_batch_size": 4, "max_context_len": 64, "buckets": (1, 2, 4)}
PROMPTS = [np.random.default_rng(10 + i).integers(0, 512, n).tolist() for i, n in enumerate((7, 4, 11))]


def _reference(device: str) -> tuple[list[list[int]], list[list[torch.Tensor]]]:
    engine = Engine(device=device, record_logits=True, **KW)
    rids = [engine.add_request(p, 2) for p in PROMPTS]
    reqs = [engine.scheduler.find(r) for r in rids]
    while engine.waiting or engine.running:
        engine.step()
    return [r.output for r in reqs], [engine.logits[r] for r in rids]


def _repetition(z: torch.Tensor, seen: list[int], r: float) -> torch.Tensor:
    z = z.clone()
    for j in set(seen):
        z[j] = z[j] / r if z[j] > 0 else z[j] * r
    return z


@pytest.mark.parametrize("device", DEVICES)
def test_penalties_give_the_tokens_computed_by_hand(device: str) -> None:
    tokens, logits = _reference(device)
    cases: list[tuple[SamplingParams, int, list[int]]] = []  # params, prompt, expected first 2 tokens
    for i, (t, (l1, l2)) in enumerate(zip(tokens, logits, strict=True)):
        first = int(_repetition(l1, PROMPTS[i], 0.1).argmax())  # NOTE: < 1 favours seen tokens
        cases.append((SamplingParams(repetition_penalty=0.1), i, [first]))
        for name, p in (("presence_penalty", -2.0), ("frequency_penalty", -1.5)):
            bonus = l2.clone()
            bonus[t[0]] -= p  # NOTE: generated once: presence and frequency alike subtract p * 1
            cases.append((SamplingParams(**{name: p}), i, [t[0], int(bonus.argmax())]))
    changed = [c for c in cases if c[2] != tokens[c[1]][: len(c[2])]]
    assert changed, "no case where a penalty changes a token: choose other prompts"
    engine = Engine(device=device, penalties=True, **KW)
    alone = [engine.generate([PROMPTS[i]], len(want), params)[0] for params, i, want in cases]
    batched = engine.generate(
        [PROMPTS[i] for _, i, _ in cases], [len(w) for _, _, w in cases], [p for p, _, _ in cases]
    )
    for (params, i, want), one, many in zip(cases, alone, batched, strict=True):
        assert one == want and many == want, (params, i, want, one, many)
    assert engine.generate(PROMPTS, 2) == tokens  # NOTE: unpenalised rows are untouched


def test_penalties_need_an_engine_that_counts() -> None:
    engine = Engine(device="cpu", use_graphs=False, **KW)
    with pytest.raises(ValueError, match="penalties"):
        engine.add_request([1, 2], 2, SamplingParams(presence_penalty=0.5))
    with pytest.raises(ValueError, match="repetition_penalty"):
        SamplingParams(repetition_penalty=0.0)
    with pytest.raises(ValueError, match="frequency_penalty"):
        SamplingParams(frequency_penalty=2.5)


@pytest.mark.parametrize("chunk", [None, 16])
def test_a_prefix_cache_hit_marks_the_whole_prompt(chunk: int | None) -> None:
    """The repetition penalty reads the whole prompt, the cached pages too (which no step
    computes): a request served from the prefix cache gets the tokens it got without."""
    prompt = np.random.default_rng(3).integers(0, 512, 40).tolist()
    params = SamplingParams(repetition_penalty=0.1)
    engine = Engine(device="cpu", penalties=True, prefill_chunk=chunk, **KW)
    first = engine.generate([prompt], 4, params)
    again = engine.generate([prompt], 4, params)
    assert engine.stats().prefix.hit_tokens == 32  # NOTE: two full pages of 16
    assert again == first != engine.generate([prompt], 4)
