"""An overlapped speculative engine whose rows back off runs the plain overlapped loop's own
DECODE steps (``engine/spec_ahead.py``): the same batches, the same static buffer contents
after every update, the same tokens; drafting and backed-off rows mixed still give plain
greedy decoding's tokens, and a request that sits out a round never commits a stale row."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from graphrt import Batch, Engine, ForwardMode, SamplingParams
from tests.engine.test_spec_lookup import PROMPTS as LOOKUP

KW = {"device": "cpu", "max_batch_size": 4, "max_context_len": 64, "buckets": (1, 2, 4), "use_graphs": True}
#: Prompt + budget + the verify's 4 nodes fit the pages plain needs: both engines hold the same
#: pages, so their DECODE buffers (page tables, slots) must match entry for entry.
LENS, MAX_NEW = (5, 3, 6, 9, 4), [7, 9, 20, 15, 8]
PROMPTS = [np.random.default_rng(10 + i).integers(0, 512, n).tolist() for i, n in enumerate(LENS)]
#: An n-gram longer than any request never matches: every round backs off.
NEVER = {"method": "ngram", "num_steps": 3, "min_match": 40, "max_match": 40}


class Buffers:
    """Every DECODE the runtime ran: its batch and the static buffers of its bucket after the
    update (cloned), in order."""

    def __init__(self, engine: Engine) -> None:
        self.batches: list[Batch] = []
        self.contents: list[dict[str, torch.Tensor]] = []
        run, runtime = engine.runtime.run, engine.runtime

        def logged(batch: Batch, **kw: object) -> torch.Tensor:
            out = run(batch, **kw)  # type: ignore[arg-type]
            if batch.mode is ForwardMode.DECODE:
                view = runtime.buffers.view(next(b for b in KW["buckets"] if b >= batch.bs))
                self.batches.append(batch)
                self.contents.append(
                    {f.name: getattr(view, f.name).clone() for f in dataclasses.fields(view)}
                )
            return out

        engine.runtime.run = logged  # type: ignore[method-assign]


def test_backed_off_rounds_are_the_plain_decode_steps() -> None:
    plain, spec = Engine("tiny-llama", overlap=True, **KW), Engine("tiny-llama", speculative=NEVER, **KW)  # type: ignore[arg-type]
    assert spec.scheduler.ahead is not None
    logs = Buffers(plain), Buffers(spec)
    assert spec.generate(PROMPTS, MAX_NEW) == plain.generate(PROMPTS, MAX_NEW)
    (p, s), stats = logs, spec.stats()
    assert stats.verify_steps == 0 and stats.backoff["decode_steps"] == len(s.batches) == len(p.batches) > 15
    for i, (a, b) in enumerate(zip(p.batches, s.batches, strict=True)):
        for name in ("input_ids", "seq_lens", "req_pool_indices", "out_cache_loc", "q_lens"):
            assert np.array_equal(getattr(a, name), getattr(b, name)), (i, name)
        assert a.sampling == b.sampling, i
    for i, (a, b) in enumerate(zip(p.contents, s.contents, strict=True)):
        assert a.keys() == b.keys()
        for name in a:
            assert torch.equal(a[name], b[name]), (i, name)
    assert stats.backoff["stale_rows"] == 0 and stats.tokens_per_round == 1.0


def test_steady_backoff_reuses_the_running_sets_rows() -> None:
    """Between set changes a backed-off round launches the kept rows' arrays, as plain does."""
    spec = Engine("tiny-llama", speculative=NEVER, **KW)  # type: ignore[arg-type]
    log = Buffers(spec)
    for p, n in zip(PROMPTS[:2], MAX_NEW[:2], strict=True):
        spec.add_request(p, n)
    for _ in range(5):
        spec.step()
    rows = spec.scheduler.rows
    assert rows is not None and len(rows.reqs) == 2
    spec.step()
    assert spec.scheduler.rows is rows and log.batches[-1].req_pool_indices is rows.arrays.rows
    assert log.batches[-1].input_ids is rows.fed and log.batches[-1].seq_lens is not log.batches[-2].seq_lens


@pytest.mark.parametrize("method", ["ngram", "suffix"])
def test_mixed_drafting_and_backed_off_rows_equal_plain(method: str) -> None:
    """Repeated phrases (drafts, often accepted), prompts with nothing to copy, a request paused
    by back-off and greedy / sampled rows in one batch: tokens equal the plain engine's."""
    prompts = [*LOOKUP[:3], PROMPTS[2], LOOKUP[3]]
    budgets = [14, 11, 12, 9, 13]
    params = [SamplingParams(temperature=0.4, seed=s) if s % 2 else SamplingParams() for s in range(5)]
    reference = Engine("tiny-llama", overlap=True, **KW).generate(prompts, budgets, params)  # type: ignore[arg-type]
    options = {"method": method, "num_steps": 3, "min_match": 1, "min_acceptance": 0.8, "backoff_rounds": 2}
    spec = Engine("tiny-llama", speculative=options, **KW)  # type: ignore[arg-type]
    assert spec.generate(prompts, budgets, params) == reference
    stats = spec.stats()
    assert stats.verify_steps > 0 and stats.drafts_accepted > 0 and stats.backoff["decode_steps"] > 0
    assert (
        stats.backoff["no_match_rows"] > 0 and stats.backoff["pad_rows"] > 0 and stats.backoff["pauses"] > 0
    )


def test_rows_whose_verifies_fall_short_sit_out_instead_of_going_stale() -> None:
    """One request at a time: after a verify that accepted less than all, the next verify's
    round is not launched ahead (it would be stale): the step reads the verify, then launches."""
    one = {**KW, "max_batch_size": 1, "buckets": (1,)}
    budgets = [14, 11, 12, 9, 13]
    reference = Engine("tiny-llama", overlap=True, **one).generate(LOOKUP, budgets)  # type: ignore[arg-type]
    spec = Engine("tiny-llama", speculative={"method": "ngram", "num_steps": 3, "min_match": 1}, **one)  # type: ignore[arg-type]
    assert spec.generate(LOOKUP, budgets) == reference
    ahead, stats = spec.scheduler.ahead, spec.stats()
    assert ahead is not None and ahead.verifies > ahead.full_verifies > 0
    # NOTE: a row goes stale only on a verify assumed to accept all: after one that did, or
    # the engine's first (the prior); every other short verify is read before the next round
    assert stats.backoff["stale_rows"] <= ahead.full_verifies + 1


@pytest.mark.parametrize("overlap", [None, False], ids=["overlapped", "synchronous"])
def test_a_backed_off_round_replays_the_decode_graph(overlap: bool | None) -> None:
    """No row drafts: each round replays the DECODE graph (never TARGET_VERIFY), the prefills a
    MIXED graph as plain's do, nothing eager; the runtime's record of steps says so in order."""
    spec = Engine("tiny-llama", speculative=NEVER, overlap=overlap, **KW)  # type: ignore[arg-type]
    plain = Engine("tiny-llama", overlap=overlap is None, **KW)  # type: ignore[arg-type]
    assert spec.generate(PROMPTS, MAX_NEW) == plain.generate(PROMPTS, MAX_NEW)
    stats, steps = spec.stats(), [r.mode for r in spec.runtime.telemetry.records]
    assert stats.verify_steps == 0 and "TARGET_VERIFY" not in steps and stats.eager == {}
    assert steps.count("DECODE") == stats.replays["DECODE"] == stats.backoff["decode_steps"] > 15
    assert steps.count("MIXED") == stats.replays["MIXED"] == stats.prefill_steps > 0
    assert steps == [r.mode for r in plain.runtime.telemetry.records]
