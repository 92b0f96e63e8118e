"""Chunked prefill (``prefill_chunk``): long prompts prefill a token budget per step in the same
EXTEND as the running requests' decode rows; the tokens equal whole-prompt prefills (greedy
and sampled, fp32 CPU), decode rows get a token every step while a long prompt prefills, and
mixed steps are counted."""

from __future__ import annotations

import numpy as np
import pytest

from graphrt import Engine, SamplingParams

KW = {"device": "cpu", "max_batch_size": 4, "buckets": (1, 2, 4), "max_context_len": 160}
PROMPTS = [[int(t) for t in np.random.default_rng(0).integers(0, 512, n)] for n in (5, 70, 3, 41, 100)]
BUDGETS = [20, 6, 9, 5, 4]


@pytest.mark.parametrize("chunk", [7, 16, 64])
@pytest.mark.parametrize("graphs", [True, False], ids=["graph", "eager"])
def test_the_same_tokens_as_whole_prompt_prefills(chunk: int, graphs: bool) -> None:
    whole = Engine("tiny-llama", **KW, use_graphs=graphs).generate(PROMPTS, BUDGETS)
    engine = Engine("tiny-llama", **KW, use_graphs=graphs, prefill_chunk=chunk)
    assert engine.generate(PROMPTS, BUDGETS) == whole
    stats = engine.stats()
    assert stats.mixed_steps > 0
    if graphs:
        assert stats.replays.get("DECODE", 0) > 0  # NOTE: steps without a chunk replay DECODE


def test_sampled_tokens_are_the_same() -> None:
    sampling = SamplingParams(temperature=0.8, top_p=0.9, seed=3)
    whole = Engine("tiny-llama", **KW, use_graphs=False).generate(PROMPTS, BUDGETS, sampling)
    chunked = Engine("tiny-llama", **KW, use_graphs=False, prefill_chunk=16)
    assert chunked.generate(PROMPTS, BUDGETS, sampling) == whole


def test_decode_rows_are_not_stalled_by_a_long_prompt() -> None:
    """Two requests decode; a 100-token prompt arrives. With a budget of 18 tokens it prefills
    in 7 mixed steps, each of which gives both running requests a token."""
    engine = Engine("tiny-llama", **KW, use_graphs=False, prefill_chunk=18)
    a = engine.add_request(PROMPTS[0], 30)
    b = engine.add_request(PROMPTS[2], 30)
    engine.step()  # both prefill (8 tokens)
    engine.step()  # a plain decode step
    long = engine.add_request(PROMPTS[4], 3)
    steps = [engine.step()]
    while long not in {rid for rid, _ in steps[-1]}:
        steps.append(engine.step())
    assert len(steps) == -(-100 // 16)  # NOTE: 18 tokens a step, 2 of them decode rows
    for produced in steps:
        assert {rid for rid, _ in produced} >= {a, b}
    assert engine.stats().mixed_steps == len(steps)


def test_prefix_caching_and_chunks_combine() -> None:
    system = PROMPTS[4][:48]
    prompts = [system + p for p in PROMPTS[:3]]
    whole = Engine("tiny-llama", **KW, use_graphs=False, prefix_caching=False).generate(prompts, 5)
    engine = Engine("tiny-llama", **KW, use_graphs=False, prefill_chunk=16)
    first = engine.generate(prompts[:1], 5)
    assert first + engine.generate(prompts[1:], 5) == whole
    prefix = engine.stats().prefix
    assert prefix is not None and prefix.hit_tokens == 2 * 48


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"prefill_chunk": 0}, r"prefill_chunk must be a positive int .* got 0"),
        ({"prefill_chunk": 16.0}, r"prefill_chunk must be a positive int .* got 16\.0"),
        (
            {"prefill_chunk": 16, "speculative": {"draft_model": "tiny-llama-draft"}},
            r"prefill_chunk does not combine with speculative decoding",
        ),
        ({"prefill_chunk": 16, "overlap": True}, r"overlap=True is not supported with prefill_chunk"),
    ],
)
def test_bad_chunk_options_are_refused_at_build_time(kw: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Engine("tiny-llama", **KW, use_graphs=False, **kw)
