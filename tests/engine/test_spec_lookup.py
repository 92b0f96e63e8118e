"""Proposer speculation (ngram, suffix): tokens equal plain decoding, greedy and sampled, graph
and eager, with rows backing off inside the same steps; synchronous rounds, then overlapped ones
(``engine/spec_ahead.py``: round n+1 launched before round n is read), whose rounds built on a
wrong assumption are dropped, never committed."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from graphrt import Engine, SamplingParams
from graphrt.engine.proposers import NgramProposer, SuffixProposer
from graphrt.step.batch import FED, PAD_DRAFT, Batch
from graphrt.step.modes import ForwardMode

_BASE = [np.random.default_rng(i).integers(0, 512, 5).tolist() for i in range(5)]
#: Repeated phrases (something to look up) and one prompt with nothing to copy.
PROMPTS = [b * 3 + b[:2] for b in _BASE[:4]] + [_BASE[4]]
MAX_NEW = [14, 4, 11, 9, 12]  # NOTE: 5 requests in buckets (1, 2, 4): sizes 4 .. 1 occur
KW = {"device": "cpu", "max_batch_size": 4, "max_context_len": 64, "buckets": (1, 2, 4)}
#: Sampled and greedy rows mixed in one batch; a low temperature keeps loops (and accepts).
MIXED = [SamplingParams(temperature=0.4, seed=s) if s % 2 else SamplingParams() for s in range(5)]


def engine(use_graphs: bool = False, overlap: bool | None = False, **spec: object) -> Engine:
    """tiny-llama (fp32 on CPU) speculating with ``spec``; ``overlap=None``: the default, which
    overlaps proposer chains."""
    return Engine("tiny-llama", use_graphs=use_graphs, overlap=overlap, speculative=spec or None, **KW)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def plain() -> Engine:
    return engine()


@pytest.fixture(scope="module")
def greedy(plain: Engine) -> list[list[int]]:
    return plain.generate(PROMPTS, MAX_NEW)


@pytest.mark.parametrize(
    "spec",
    [
        {"method": "ngram", "num_steps": 3},
        {"method": "suffix", "num_steps": 3, "min_match": 1},
        # NOTE: short matches (2 .. 4 tokens) so that these few short requests draft trees
        {
            "method": "suffix",
            "num_steps": 2,
            "topk": 3,
            "num_draft_tokens": 6,
            "min_match": 2,
            "max_match": 4,
        },
    ],
    ids=["ngram", "suffix", "suffix-tree"],
)
def test_greedy_tokens_equal_plain_eager(greedy: list[list[int]], spec: dict[str, object]) -> None:
    e = engine(**spec)
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
    # NOTE: the prefills replay MIXED graphs, as a plain engine's do (prefill_graph_tokens)
    assert set(graph.replays) == {"DECODE", "TARGET_VERIFY", "MIXED"} and eager.replays == {}
    assert graph.replays["MIXED"] == graph.prefill_steps and "EXTEND" not in graph.eager


def test_sampled_tokens_equal_plain_sampling_whatever_the_batch(plain: Engine) -> None:
    reference = plain.generate(PROMPTS, MAX_NEW, MIXED)
    e = engine(method="ngram", num_steps=3)
    assert e.generate(PROMPTS, MAX_NEW, MIXED) == reference
    assert e.stats().acceptance_rate > 0  # sampled rows accepted drafts too
    # one request alone, then in another batch order: the same tokens (counter RNG)
    assert e.generate(PROMPTS[3:4], MAX_NEW[3:4], MIXED[3:4]) == reference[3:4]
    order = [4, 2, 0, 3, 1]
    out = e.generate([PROMPTS[i] for i in order], [MAX_NEW[i] for i in order], [MIXED[i] for i in order])
    assert out == [reference[i] for i in order]


def test_backoff_by_batch_size_runs_decode_steps(greedy: list[list[int]]) -> None:
    e = engine(method="ngram", disable_batch_size=2)
    assert e.generate(PROMPTS, MAX_NEW) == greedy
    stats = e.stats()
    assert stats.backoff["batch_steps"] > 0 and stats.backoff["decode_steps"] >= stats.backoff["batch_steps"]
    assert stats.verify_steps > 0  # the last two requests ran alone: they drafted


def test_backoff_pauses_requests_that_are_never_accepted(greedy: list[list[int]]) -> None:
    e = engine(method="ngram", min_match=1, max_match=1, min_acceptance=1.0, backoff_rounds=2)
    assert e.generate(PROMPTS, MAX_NEW) == greedy
    stats = e.stats()
    assert stats.backoff["pauses"] > 0 and stats.backoff["paused_rows"] >= 2 * stats.backoff["pauses"] - 4


def test_stop_tokens_and_budgets_cut_a_round(greedy: list[list[int]]) -> None:
    stop = greedy[0][5]
    params = [SamplingParams(stop_token_ids=(stop,))] + [SamplingParams()] * 4
    out = engine(method="ngram", num_steps=4).generate(PROMPTS, MAX_NEW, params)
    assert out == [greedy[0][: greedy[0].index(stop) + 1], *greedy[1:]]


@pytest.mark.parametrize(
    "spec", [{"method": "ngram"}, {"method": "suffix", "min_match": 1}], ids=["ngram", "suffix"]
)
def test_overlapped_greedy_tokens_equal_plain(greedy: list[list[int]], spec: dict[str, object]) -> None:
    e = engine(overlap=None, num_steps=3, **spec)
    assert e.scheduler.ahead is not None  # NOTE: the default overlaps proposer chains
    assert e.generate(PROMPTS, MAX_NEW) == greedy
    stats = e.stats()
    assert stats.spec_overlap and stats.verify_steps > 0 and stats.drafts_accepted > 0
    assert stats.acceptance_rate == stats.drafts_accepted / stats.drafts_proposed
    # a round that accepted less than the next one assumed: that one was dropped, not committed
    assert stats.backoff["stale_rows"] > 0
    assert stats.decode_steps == stats.backoff["decode_steps"] + stats.eager.get("TARGET_VERIFY", 0)


def test_overlapped_sampled_tokens_equal_the_synchronous_run(plain: Engine) -> None:
    sync = engine(method="ngram", num_steps=3)
    reference = sync.generate(PROMPTS, MAX_NEW, MIXED)
    assert sync.scheduler.ahead is None
    e = engine(overlap=None, method="ngram", num_steps=3)
    assert e.generate(PROMPTS, MAX_NEW, MIXED) == reference == plain.generate(PROMPTS, MAX_NEW, MIXED)
    assert e.stats().acceptance_rate > 0


def test_overlapped_graph_equals_eager(greedy: list[list[int]]) -> None:
    graph = engine(True, overlap=None, method="ngram", num_steps=2)
    assert graph.generate(PROMPTS, MAX_NEW) == greedy
    stats = graph.stats()
    assert stats.replays.get("TARGET_VERIFY", 0) > 0 and stats.fallbacks == {} and stats.eager == {}
    assert stats.replays["MIXED"] == stats.prefill_steps  # NOTE: prefill graphs, as plain


def test_overlapped_stops_budgets_and_backoff(greedy: list[list[int]]) -> None:
    stop = greedy[0][4]
    params = [SamplingParams(stop_token_ids=(stop,))] + [SamplingParams()] * 4
    e = engine(overlap=None, method="ngram", num_steps=4, disable_batch_size=2)
    out = e.generate(PROMPTS, MAX_NEW, params)
    assert out == [greedy[0][: greedy[0].index(stop) + 1], *greedy[1:]]
    assert e.stats().backoff["batch_steps"] > 0 and not e.running
    paused = engine(
        overlap=None, method="ngram", min_match=1, max_match=1, min_acceptance=1.0, backoff_rounds=2
    )
    assert paused.generate(PROMPTS, MAX_NEW) == greedy and paused.stats().backoff["pauses"] > 0


def test_trees_and_draft_models_stay_synchronous() -> None:
    tree = {"method": "suffix", "num_steps": 2, "topk": 2}
    assert engine(overlap=None, **tree).overlap is None
    with pytest.raises(
        ValueError, match=r"overlap=True is not supported with speculative decoding with tree"
    ):
        engine(overlap=True, **tree)


def test_fed_verify_ids_checked_with_nothing_written() -> None:
    e = engine(overlap=None, method="ngram", num_steps=2)
    e.generate(PROMPTS[:1], 3)
    last = e.runtime.tokens.last.clone()

    def verify(ids: list[int]) -> Batch:
        return Batch.create(
            ForwardMode.TARGET_VERIFY, input_ids=ids, seq_lens=[3], req_pool_indices=[0],
            out_cache_loc=[0, 1, 2], q_lens=[3], sampling=(SamplingParams(),),
        )  # fmt: skip

    feed = e.runtime.tokens.decode
    with pytest.raises(ValueError, match=r"node 0 must be FED \(-1\), got 5 in request 0"):
        e.runtime.run(verify([5, 6, 7]), feed=feed)
    with pytest.raises(ValueError, match=r"PAD_DRAFT \(-2\) or a token id in \[0, 512\), got 512 at node 2"):
        e.runtime.run(verify([FED, PAD_DRAFT, 512]), feed=feed)
    assert torch.equal(e.runtime.tokens.last, last)


def test_peek_continues_past_the_tokens_in_flight() -> None:
    prompt = [1, 2, 3, 4, 1, 2, 3, 4, 1, 2]
    ngram = NgramProposer(2, 3, 3)
    assert ngram.propose(prompt, []) == [[3, 4, 1]]
    # after [3, 4] (in flight, not read): the next token guessed 1, then the drafts 2, 3, 4
    assert ngram.peek(prompt, [], (3, 4), 4) == [1, 2, 3, 4]
    assert ngram.peek(prompt, [], (9, 9), 4) == []  # nothing seen ends like that
    suffix = SuffixProposer(1, 3, 4, 1)  # NOTE: its trie holds substrings of max_match + steps + 1
    assert suffix.peek(prompt, [], (3, 4), 4) == [1, 2, 3, 4]
    assert suffix.propose(prompt, []) == [[3, 4, 1, 2]]  # peeking indexed nothing
