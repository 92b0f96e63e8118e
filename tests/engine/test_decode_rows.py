"""DecodeRows: the DECODE batches of a running set, advanced step by step without per-request
loops, hold exactly what per-request arithmetic gives (slots, lengths, budget ends), across
its blocks of precomputed slots; and an overlapped engine whose requests run past several such
blocks, joining and leaving mid-block, gives the plain engine's tokens.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from graphrt import Batch, Engine, ForwardMode, SamplingParams
from graphrt.engine.batches import SLOT_STEPS, DecodeRows
from graphrt.engine.request import Request

PS = 4


def requests() -> list[Request]:
    """Three requests, pages scattered (not in order), prompts ending mid-page and on a page end,
    budgets running past two blocks of slots; request 2's ends first, at decode step 68."""
    reqs = []
    for rid, (prompt, budget, pages) in enumerate(
        [
            (5, 80, [9, 2, 30, 4, *range(40, 58)]),
            (8, 72, [7, 1, 3, *range(100, 117)]),
            (1, 70, list(range(60, 78))),
        ]
    ):
        r = Request(rid, list(range(prompt)), budget, req_idx=10 + rid, pages=pages)
        r.output = [1]  # NOTE: the prefill's token: the first decode writes position len(prompt)
        reqs.append(r)
    return reqs


def test_batches_match_per_request_slots_and_budgets() -> None:
    reqs = requests()
    rows = DecodeRows(reqs, PS, sampled=False)
    pos = np.array([len(r.prompt) for r in reqs])  # the position each decode step writes
    limit = np.array([len(r.prompt) + r.max_new_tokens for r in reqs])
    for step in range(3 * SLOT_STEPS):
        batch = rows.batch()
        want = [int(r.at(np.array([p]), PS)[0]) for r, p in zip(reqs, pos, strict=True)]
        assert batch.out_cache_loc.tolist() == want, step
        assert batch.seq_lens.tolist() == (pos + 1).tolist()
        assert batch.req_pool_indices.tolist() == [10, 11, 12]
        assert not batch.out_cache_loc.flags.writeable
        finishing = rows.advance(np.full(3, step, dtype=np.int64))
        pos += 1
        # NOTE: the step's token is a request's last when the next step's length reaches its limit
        assert finishing.tolist() == (pos + 1 >= limit).tolist(), step
        if finishing.any():
            break
        assert rows.batch().input_ids.tolist() == [step] * 3
    assert step == 68 and finishing.tolist() == [False, False, True]


def test_pending_counts_the_step_in_flight() -> None:
    reqs = requests()
    alone = DecodeRows(reqs, PS, sampled=False)
    ahead = DecodeRows(reqs, PS, sampled=False, pending={id(reqs[1])})
    assert (ahead.seq_lens - alone.seq_lens).tolist() == [0, 1, 0]
    assert ahead.batch().out_cache_loc[1] == reqs[1].at(np.array([len(reqs[1].prompt) + 1]), PS)[0]


def test_append_and_stop_tokens() -> None:
    reqs = requests()
    reqs[2].sampling = SamplingParams(stop_token_ids=(7, 8))
    rows = DecodeRows(reqs, PS, sampled=True)
    assert rows.append([4, 5, 6]) == [(0, 4), (1, 5), (2, 6)]
    assert [r.output for r in reqs] == [[1, 4], [1, 5], [1, 6]]
    finishing = rows.advance()
    assert rows.finished(finishing, np.array([4, 5, 6])) == []
    assert rows.finished(finishing, np.array([8, 5, 7])) == [reqs[2]]


LONG_NEW = [90, 5, 60, 50, 40, 12]  # NOTE: a running set lasting past a block of slots; ends mid-block


def check_slots(e: Engine) -> list[int]:
    """Wrap ``e``'s runtime: every DECODE step's slots must be ``Request.at`` of the request
    holding each row at the step's position; returns the list of decode batch sizes seen."""
    run, sizes = e.runtime.run, []

    def checked(batch: Batch, **kw: object) -> torch.Tensor:
        if batch.mode is ForwardMode.DECODE:
            holders = {r.req_idx: r for r in e.running}
            rows = batch.req_pool_indices.tolist()
            want = [
                int(holders[row].at(np.array([n - 1]), e.page_size)[0])
                for row, n in zip(rows, batch.seq_lens.tolist(), strict=True)
            ]
            assert batch.out_cache_loc.tolist() == want
            sizes.append(batch.bs)
        return run(batch, **kw)  # type: ignore[arg-type]

    e.runtime.run = checked  # type: ignore[method-assign]
    return sizes


@pytest.mark.parametrize("sampled", [False, True])
def test_long_runs_overlap_same_tokens(sampled: bool) -> None:
    prompts = [np.random.default_rng(i).integers(0, 512, 3 + 5 * i).tolist() for i in range(len(LONG_NEW))]
    params = [SamplingParams(temperature=1.1, seed=7 + i) for i in range(len(prompts))] if sampled else None
    kw = {"device": "cpu", "max_batch_size": 4, "max_context_len": 128, "buckets": (1, 2, 4), "page_size": PS}
    outs = []
    for overlap in (False, True):
        e = Engine(overlap=overlap, **kw)  # type: ignore[arg-type]
        sizes = check_slots(e)
        outs.append(e.generate(prompts, LONG_NEW, params))
        assert len(sizes) > 2 * SLOT_STEPS and len(set(sizes)) > 2  # long runs, the set changing
        e.close()
    assert [len(o) for o in outs[0]] == LONG_NEW
    assert outs[1] == outs[0]
