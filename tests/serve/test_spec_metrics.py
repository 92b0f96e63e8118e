"""A speculating server's ``/metrics``: acceptance, tokens per round and back-off, from the loop's
stats (which read the engine's speculative runner)."""

from __future__ import annotations

import torch

from graphrt import Engine
from graphrt.serve.loop import LoopStats, spec_counts
from graphrt.serve.metrics import Metrics


def test_spec_gauges_and_counters() -> None:
    m = Metrics("m", speculative=True)
    text = m.scrape(
        LoopStats(spec_drafts=10, spec_accepted=4, spec_verifies=5, spec_tokens_per_round=1.5, spec_paused=1)
    ).decode()
    assert 'graphrt:spec_decode_acceptance_rate{model_name="m"} 0.4' in text
    assert 'graphrt:spec_decode_tokens_per_round{model_name="m"} 1.5' in text
    assert 'graphrt:spec_decode_paused_requests{model_name="m"} 1.0' in text
    assert 'graphrt:spec_decode_num_draft_tokens_total{model_name="m"} 10.0' in text
    assert 'graphrt:spec_decode_num_drafts_total{model_name="m"} 5.0' in text
    text = m.scrape(LoopStats(spec_drafts=12, spec_accepted=4, spec_verifies=6)).decode()
    assert 'graphrt:spec_decode_num_draft_tokens_total{model_name="m"} 12.0' in text
    assert 'graphrt:spec_decode_num_accepted_tokens_total{model_name="m"} 4.0' in text
    assert "spec_decode" not in Metrics("plain").scrape(LoopStats()).decode()


def test_loop_stats_read_the_engine() -> None:
    e = Engine(
        "tiny-llama", device="cpu", use_graphs=False, max_batch_size=2, max_context_len=48,
        dtype=torch.float32, speculative={"method": "ngram", "num_steps": 2},
    )  # fmt: skip
    e.generate([[3, 4, 5, 3, 4, 5, 3, 4], [7, 8, 9, 7, 8, 9, 7]], 6)
    stats = e.stats()
    drafts, accepted, verifies, per_round, paused = spec_counts(e.spec, e.running)
    assert (drafts, accepted, verifies) == (stats.drafts_proposed, stats.drafts_accepted, stats.verify_steps)
    assert drafts > 0 and per_round == stats.tokens_per_round > 0 and paused == stats.paused_requests == 0
    assert spec_counts(None, []) == (0, 0, 0, 0.0, 0)
