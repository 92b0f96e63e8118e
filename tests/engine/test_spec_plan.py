"""Where an overlapped round's rows start and what they draft (:mod:`graphrt.engine.spec_plan`),
from the step in flight: a DECODE of rows, a verify (all drafts assumed accepted, or the row sits
out), a stale row or none; and the rows a read drops (``Launched.kept``)."""

from __future__ import annotations

import numpy as np

from graphrt.engine.backoff import BackoffCounts
from graphrt.engine.batches import DecodeRows
from graphrt.engine.overlap import Launched
from graphrt.engine.request import Request
from graphrt.engine.spec_layout import Flight, Layouts, Plan
from graphrt.engine.spec_plan import positions, propose
from graphrt.step.batch import FED, PAD_DRAFT


def _req(rid: int, prompt: int, output: int, max_new: int = 20) -> Request:
    return Request(rid, list(range(prompt)), max_new, output=[7] * output, req_idx=rid, pages=[rid])


class Proposer:
    """Records its calls; drafts ``chain`` (a peek's first token guesses the step in flight's)."""

    def __init__(self, chain: list[int]) -> None:
        self.chain, self.calls = chain, []

    def propose(self, prompt: list[int], output: list[int]) -> list[list[int]]:
        self.calls.append(("propose", len(output)))
        return [self.chain] if self.chain else []

    def peek(self, prompt: list[int], output: list[int], tail: tuple[int, ...], count: int) -> list[int]:
        self.calls.append(("peek", tail, count))
        return [99, *self.chain][:count] if self.chain else []


def test_a_decode_in_flight_gives_each_row_its_next_position() -> None:
    a, b = _req(0, 4, 2), _req(1, 3, 5)
    rows = DecodeRows([a, b], page_size=16, sampled=False, seq_lens=np.array([7, 9]))
    step = Launched([a, b], np.zeros(2, dtype=np.int64), None, rows=rows)
    rows.advance()  # NOTE: launched: the rows hold the next step's positions
    assert positions([a, b], step, 3) == ([a, b], [8, 10], [(), ()], [3, 3], [False, False])
    step.stale = {id(b)}  # the verify before it accepted less than b's row assumed
    assert positions([a, b], step, 3) == ([a, b], [8, 8], [(), None], [3, 3], [False, True])


def test_a_verify_in_flight_assumed_accepted_or_sat_out() -> None:
    r = [_req(i, 4, 3) for i in range(5)]
    for x in r:
        x.spec.ahead = Flight(object(), 7, (5, 6))  # base 7, two drafts in flight
    r[1].spec.full = False  # its last verify accepted less than all: it sits out
    r[2].spec.ahead.valid = False  # stale: starts from its read tokens
    r[3].spec.ahead = None  # nothing in flight
    r[4].max_new_tokens = 6  # 4 + 6 = 10 tokens: the verify in flight ends it if all accepted
    reqs, bases, tails, depths, exact = positions(r, None, 3)
    assert reqs == [r[0], r[2], r[3]] and bases == [10, 7, 7] and tails == [(5, 6), None, None]
    assert depths == [3, 3, 3] and exact == [False, True, True]
    r[0].spec.full = True  # a request's own last verify outweighs the engine's record
    assert positions(r[:2], None, 3, prior=False)[0] == [r[0]]
    fresh = _req(9, 4, 3)
    fresh.spec.ahead = Flight(object(), 7, (5,))
    assert positions([fresh], None, 3, prior=False)[0] == []  # first verify: the engine's record
    assert positions([fresh], None, 3, prior=True)[1] == [9]


def test_depths_shrink_with_the_budget() -> None:
    r = _req(0, 4, 3, max_new=6)  # 7 of 10 tokens committed: 3 left, so at most 2 drafts
    assert positions([r], None, 4)[3] == [2]
    assert positions([r], None, 0)[3] == [0]  # drafts off (disable_batch_size)


def test_propose_peeks_past_the_step_in_flight() -> None:
    reqs = [_req(i, 4, 3) for i in range(4)]
    props = [Proposer([1, 2, 3, 4]), Proposer([]), Proposer([5]), Proposer([8, 9])]
    for r, p in zip(reqs, props, strict=True):
        r.spec.proposer = p
    reqs[3].spec.backoff.paused = 2
    counts = BackoffCounts()
    chains = propose(reqs, [(3, 4), (), None, ()], [2, 3, 3, 3], 3, counts)
    assert chains == [[1, 2], [], [5], []]
    assert props[0].calls == [("peek", (3, 4), 4)] and props[2].calls == [("propose", 3)]
    assert props[3].calls == [] and reqs[3].spec.backoff.paused == 1
    assert (counts.no_match_rows, counts.paused_rows) == (1, 1)
    plan = Plan(Layouts().get(reqs), [5, 5, 5, 5], chains)
    assert plan.input_ids(3).reshape(4, 4).tolist() == [
        [FED, 1, 2, PAD_DRAFT],
        [FED] + [PAD_DRAFT] * 3,
        [FED, 5, PAD_DRAFT, PAD_DRAFT],
        [FED] + [PAD_DRAFT] * 3,
    ]
    assert propose(reqs[1:2], None, 3, 3, counts) is None and counts.no_match_rows == 2
    assert propose(reqs[:1], None, 0, 3, counts) is None and len(props[0].calls) == 1  # depth 0: no call


def test_a_read_drops_stale_and_done_rows() -> None:
    a, b, c = _req(0, 4, 2), _req(1, 4, 2), _req(2, 4, 2, max_new=2)  # c is done
    step = Launched([a, b, c], np.array([5, 6, 7]), None, stale={id(b)})
    assert step.kept(np.array([5, 6, 7])) == [(a, 5)]
