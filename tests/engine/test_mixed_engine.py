"""Chunked prefill on graphs: an engine with ``prefill_chunk`` runs its mixed steps (decode rows
plus prompt chunks) and its prefill-only chunks as MIXED batches that replay token-bucketed
graphs, counted in ``stats()``, with the tokens of whole-prompt prefills. With the sampling
extras an LLM's engine keeps (penalties, log-probabilities, token masks) the mixed steps still
replay graphs (``tests/engine/test_mixed_extras.py``)."""

from __future__ import annotations

import numpy as np
import pytest

from graphrt import Engine, SamplingParams
from graphrt.engine.config import token_ladder

KW = {"device": "cpu", "max_batch_size": 4, "buckets": (1, 2, 4), "max_context_len": 128}
PROMPTS = [[int(t) for t in np.random.default_rng(1).integers(0, 512, n)] for n in (4, 50, 2, 29)]
BUDGETS = [12, 4, 7, 3]


@pytest.mark.slow
def test_mixed_steps_replay_graphs_and_give_the_same_tokens() -> None:
    sampling = [SamplingParams(temperature=0.7, seed=5), SamplingParams()] * 2
    whole = Engine("tiny-llama", **KW, use_graphs=False).generate(PROMPTS, BUDGETS, sampling)
    engine = Engine("tiny-llama", **KW, prefill_chunk=12)
    assert engine.runtime.config.token_buckets == token_ladder(12) == (1, 2, 4, 8, 12)
    assert engine.generate(PROMPTS, BUDGETS, sampling) == whole
    stats = engine.stats()
    assert stats.mixed_steps > 0 and stats.fallbacks == {}
    # NOTE: every chunked step, mixed or prefill-only, replays a MIXED graph; nothing runs eagerly
    assert stats.replays["MIXED"] == stats.mixed_steps + stats.prefill_steps
    assert stats.eager == {}


@pytest.mark.slow
def test_prefill_only_chunks_replay_graphs() -> None:
    """One 50-token prompt alone, 16 tokens a step: 16, 16, 16 and 2, each a graph replay."""
    engine = Engine("tiny-llama", **KW, prefill_chunk=16)
    out = engine.generate([PROMPTS[1]], 3)
    assert out == Engine("tiny-llama", **KW, use_graphs=False).generate([PROMPTS[1]], 3)
    stats = engine.stats()
    assert (stats.replays["MIXED"], stats.prefill_steps, stats.mixed_steps) == (4, 4, 0)
    assert stats.replays["DECODE"] == 2 and stats.eager == {}
