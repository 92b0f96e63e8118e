"""Speculative engine: tokens equal plain greedy decoding, with and without graphs."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from graphrt import Engine

PROMPTS = [np.random.default_rng(i).integers(0, 512, 3 + 2 * i).tolist() for i in range(6)]
MAX_NEW = [12, 5, 9, 12, 1, 7]  # NOTE: 6 requests in buckets (1, 2, 4): sizes 4, 3, 2, 1 occur
KW = {"device": "cpu", "max_batch_size": 4, "max_context_len": 64, "buckets": (1, 2, 4)}


@pytest.fixture(scope="module")
def plain() -> list[list[int]]:
    return Engine("tiny-llama", **KW).generate(PROMPTS, MAX_NEW)  # type: ignore[arg-type]


def spec_engine(use_graphs: bool, **options: object) -> Engine:
    return Engine("tiny-llama", use_graphs=use_graphs, speculative=dict(options), **KW)  # type: ignore[arg-type]


@pytest.mark.slow
@pytest.mark.parametrize("num_steps", [1, 3])
def test_speculative_tokens_equal_plain_greedy(plain: list[list[int]], num_steps: int) -> None:
    runs = {}
    for use_graphs in (True, False):
        engine = spec_engine(use_graphs, num_steps=num_steps, draft_model="tiny-llama-draft")
        runs[use_graphs] = (engine.generate(PROMPTS, MAX_NEW), engine.stats())
    (graph_out, graph), (eager_out, eager) = runs[True], runs[False]
    assert graph_out == plain and eager_out == plain
    # acceptance is a pure function of the tokens: identical with and without graphs
    assert graph.accepted_per_position == eager.accepted_per_position
    assert (graph.verify_steps, graph.acceptance_rate) == (eager.verify_steps, eager.acceptance_rate)
    assert graph.replays == {"TARGET_VERIFY": graph.decode_steps} and graph.fallbacks == {}
    draft_modes = {"DRAFT_EXTEND"} | ({"DRAFT_DECODE"} if num_steps > 1 else set())
    assert set(graph.draft_replays) == draft_modes and eager.replays == {}
    assert len(graph.accepted_per_position) == num_steps
    assert graph.mean_accept_length == pytest.approx(1 + graph.acceptance_rate * num_steps)


@pytest.mark.slow
def test_draft_equal_to_target_accepts_everything(plain: list[list[int]]) -> None:
    engine = spec_engine(True, num_steps=3, draft_model="tiny-llama")  # draft_init="target": a copy
    assert engine.generate(PROMPTS, MAX_NEW) == plain
    stats = engine.stats()
    assert stats.acceptance_rate == 1.0 and stats.mean_accept_length == 4.0
    assert stats.decode_steps < max(MAX_NEW)  # fewer rounds than tokens


@pytest.mark.slow
def test_always_rejected_draft_still_decodes_exactly(plain: list[list[int]]) -> None:
    assert all(0 not in out for out in plain)  # NOTE: the broken draft only ever proposes token 0
    engine = spec_engine(True, num_steps=3)
    with torch.no_grad():
        engine.draft_model.lm_head.weight.zero_()  # graphs read weights in place at replay
    assert engine.generate(PROMPTS, MAX_NEW) == plain
    stats = engine.stats()
    assert stats.acceptance_rate == 0.0 and stats.accepted_per_position == (0, 0, 0)
    assert stats.mean_accept_length == 1.0


def test_speculative_options_are_checked() -> None:
    with pytest.raises(ValueError, match=r"unknown speculative option\(s\) \['steps'\]"):
        spec_engine(False, steps=3)
    with pytest.raises(ValueError, match=r"draft_init must be one of \('target', 'seed', 'checkpoint'\)"):
        spec_engine(False, num_steps=3, draft_init="copy")
    with pytest.raises(ValueError, match=r"num_draft_tokens 8 must lie in \[2, 1 \+ topk \* num_steps = 7\]"):
        spec_engine(False, num_steps=3, topk=2, num_draft_tokens=8)
    with pytest.raises(ValueError, match=r"num_draft_tokens must be num_steps \+ 1 = 4"):
        spec_engine(False, num_steps=3, num_draft_tokens=3)
    engine = spec_engine(False, num_steps=3)
    with pytest.raises(ValueError, match=r"\+ 4 draft tokens exceeds max_context_len 64"):
        engine.add_request([1] * 50, 11)
