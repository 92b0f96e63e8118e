"""Proposer speculation (ngram, suffix): tokens equal plain decoding, greedy and sampled, graph
and eager, with rows backing off inside the same steps."""

from __future__ import annotations

import numpy as np
import pytest

from graphrt import Engine, SamplingParams

_BASE = [np.random.default_rng(i).integers(0, 512, 5).tolist() for i in range(5)]
#: Repeated phrases (something to look up) and one prompt with nothing to copy.
PROMPTS = [b * 3 + b[:2] for b in _BASE[:4]] + [_BASE[4]]
MAX_NEW = [14, 4, 11, 9, 12]  # NOTE: 5 requests in buckets (1, 2, 4): sizes 4 .. 1 occur
KW = {"device": "cpu", "max_batch_size": 4, "max_context_len": 64, "buckets": (1, 2, 4)}
#: Sampled and greedy rows mixed in one batch; a low temperature keeps loops (and accepts).
MIXED = [SamplingParams(temperature=0.4, seed=s) if s % 2 else SamplingParams() for s in range(5)]


def engine(use_graphs: bool, **spec: object) -> Engine:
    # NOTE: the synchronous rounds (tests/engine/test_spec_overlap.py covers the overlapped ones)
    return Engine("tiny-llama", use_graphs=use_graphs, overlap=False, speculative=spec or None, **KW)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def plain() -> Engine:
    return engine(False)


@pytest.fixture(scope="module")
def greedy(plain: Engine) -> list[list[int]]:
    return plain.generate(PROMPTS, MAX_NEW)


@pytest.mark.parametrize(
    "spec",
    [
        {"method": "ngram", "num_steps": 3},
        {"method": "suffix", "num_steps": 3, "min_match": 1},
        {"method": "suffix", "num_steps": 2, "topk": 3, "num_draft_tokens": 6},
    ],
    ids=["ngram", "suffix", "suffix-tree"],
)
def test_greedy_tokens_equal_plain_eager(greedy: list[list[int]], spec: dict[str, object]) -> None:
    e = engine(False, **spec)
    assert e.generate(PROMPTS, MAX_NEW) == greedy
    stats = e.stats()
    # drafts were made and accepted, and rows without drafts ran in verify steps too
    assert stats.verify_steps > 0 and stats.acceptance_rate > 0.5 and stats.tokens_per_round > 1.1
    assert stats.backoff["pad_rows"] > 0 and stats.backoff["no_match_rows"] > 0
    assert stats.decode_steps == stats.backoff["decode_steps"] + stats.replays.get("TARGET_VERIFY", 0) + (
        stats.eager.get("TARGET_VERIFY", 0)
    )


@pytest.mark.slow
@pytest.mark.parametrize("spec", [{"method": "ngram"}, {"method": "suffix", "topk": 2, "min_match": 1}])
def test_graph_equals_eager_greedy_and_sampled(plain: Engine, spec: dict[str, object]) -> None:
    reference = plain.generate(PROMPTS, MAX_NEW, MIXED)
    runs = {}
    for use_graphs in (True, False):
        e = engine(use_graphs, num_steps=3, **spec)
        runs[use_graphs] = (e.generate(PROMPTS, MAX_NEW, MIXED), e.stats())
    (graph_out, graph), (eager_out, eager) = runs[True], runs[False]
    assert graph_out == eager_out == reference
    assert (graph.verify_steps, graph.accepted_per_position) == (
        eager.verify_steps,
        eager.accepted_per_position,
    )
    assert graph.backoff == eager.backoff and graph.fallbacks == {}
    assert set(graph.replays) == {"DECODE", "TARGET_VERIFY"} and eager.replays == {}


def test_sampled_tokens_equal_plain_sampling_whatever_the_batch(plain: Engine) -> None:
    reference = plain.generate(PROMPTS, MAX_NEW, MIXED)
    e = engine(False, method="ngram", num_steps=3)
    assert e.generate(PROMPTS, MAX_NEW, MIXED) == reference
    assert e.stats().acceptance_rate > 0  # sampled rows accepted drafts too
    # one request alone, then in another batch order: the same tokens (counter RNG)
    assert e.generate(PROMPTS[3:4], MAX_NEW[3:4], MIXED[3:4]) == reference[3:4]
    order = [4, 2, 0, 3, 1]
    out = e.generate([PROMPTS[i] for i in order], [MAX_NEW[i] for i in order], [MIXED[i] for i in order])
    assert out == [reference[i] for i in order]


def test_backoff_by_batch_size_runs_decode_steps(greedy: list[list[int]]) -> None:
    e = engine(False, method="ngram", disable_batch_size=2)
    assert e.generate(PROMPTS, MAX_NEW) == greedy
    stats = e.stats()
    assert stats.backoff["batch_steps"] > 0 and stats.backoff["decode_steps"] >= stats.backoff["batch_steps"]
    assert stats.verify_steps > 0  # the last two requests ran alone: they drafted


def test_backoff_pauses_requests_that_are_never_accepted(greedy: list[list[int]]) -> None:
    e = engine(False, method="ngram", min_match=1, max_match=1, min_acceptance=1.0, backoff_rounds=2)
    assert e.generate(PROMPTS, MAX_NEW) == greedy
    stats = e.stats()
    assert stats.backoff["pauses"] > 0 and stats.backoff["paused_rows"] >= 2 * stats.backoff["pauses"] - 4


def test_stop_tokens_and_budgets_cut_a_round(greedy: list[list[int]]) -> None:
    stop = greedy[0][5]
    params = [SamplingParams(stop_token_ids=(stop,))] + [SamplingParams()] * 4
    out = engine(False, method="ngram", num_steps=4).generate(PROMPTS, MAX_NEW, params)
    assert out == [greedy[0][: greedy[0].index(stop) + 1], *greedy[1:]]
