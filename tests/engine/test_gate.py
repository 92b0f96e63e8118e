"""The proposer gate (graphrt/engine/gate.py): drafts offered only while recent guesses hit,
guesses scored whether offered or not, each position once, chains on a wrong tail dropped."""

from __future__ import annotations

import pytest

from graphrt.engine.gate import GATE_WEIGHT, Gate
from graphrt.engine.proposers import PROPOSERS, NgramProposer, SuffixProposer
from graphrt.engine.spec_options import SpecOptions

PROMPT = [1, 2, 3, 4, 1, 2, 3, 4]


def _after(rate: float, *hits: bool) -> float:
    for hit in hits:
        rate += GATE_WEIGHT * (hit - rate)
    return rate


def test_gate_closes_after_misses_scores_while_closed_and_reopens() -> None:
    gate = Gate(NgramProposer(min_match=2, max_match=2, steps=2), min_hit_rate=0.6)
    assert gate.propose(PROMPT, []) == [[1, 2]] and gate.rate == 1.0  # (3, 4) before 1, 2
    assert gate.propose(PROMPT, [5]) == []  # 1 missed; (4, 5) unseen: no chain
    assert gate.rate == _after(1.0, False) == 0.75
    assert gate.propose(PROMPT, [5, 3, 4]) == [[5, 3]]  # the latest (3, 4) was followed by 5
    assert gate.propose(PROMPT, [5, 3, 4, 6]) == []  # 5 missed: closed
    closed = _after(0.75, False)
    assert gate.rate == closed < 0.6
    # closed, it still guesses (6, 3 after the latest 3, 4) and keeps the guess to score
    assert gate.propose(PROMPT, [5, 3, 4, 6, 3, 4]) == [] and gate.pending[-1][2] == [6, 3]
    assert gate.withheld == 1  # the rounds before had no chain at all: not withheld
    # both guessed tokens came: two hits reopen it, and it offers its next chain
    assert gate.propose(PROMPT, [5, 3, 4, 6, 3, 4, 6, 3]) == [[4, 6]]
    assert gate.rate == _after(closed, True, True) > 0.6


def test_overlapping_chains_score_each_position_once() -> None:
    gate = Gate(NgramProposer(min_match=2, max_match=2, steps=3), min_hit_rate=0.5)
    assert gate.peek(PROMPT, [], (), 3) == [1, 2, 3]  # guesses positions 8, 9, 10
    assert gate.peek(PROMPT, [1], (), 3) == [2, 3, 4]  # guesses 9, 10, 11
    assert gate.rate == 1.0 and len(gate.pending) == 2  # the first is not decided yet
    gate.propose(PROMPT, [1, 2, 9])
    # positions 8, 9 hit and 10 missed, once: the second chain's 9 and 10 are not counted again
    assert gate.rate == _after(1.0, True, True, False) == 0.75 and gate.scored == 11


def test_chain_on_a_tail_not_committed_is_dropped() -> None:
    gate = Gate(NgramProposer(min_match=2, max_match=2, steps=3), min_hit_rate=0.5)
    # past an assumed tail (1, 2): the latest (1, 2) with a known next is at 4, 5 → 3, 4, then
    # the copy runs into the tail itself
    assert gate.peek(PROMPT, [], (1, 2), 3) == [3, 4, 1]
    assert gate.propose(PROMPT, [1, 5]) == []  # the round in flight committed 1, 5, not 1, 2
    assert gate.rate == 1.0 and gate.pending == []


def test_gate_wraps_trees_and_the_option_turns_it_off() -> None:
    gate = Gate(SuffixProposer(min_match=1, max_match=2, steps=2, topk=2), min_hit_rate=0.5)
    prompt = [1, 2, 3, 1, 2, 4, 1, 2]
    assert gate.propose(prompt, []) == [[3, 1], [4, 1]]
    assert gate.pending == [(8, (), [3, 1])]  # the best branch is the guess scored
    ngram = SpecOptions.parse({"method": "ngram"})
    assert isinstance(PROPOSERS["ngram"](ngram), Gate)
    assert (ngram.backoff.min_hit_rate, ngram.min_match, ngram.max_match) == (0.6, 3, 8)
    bare = PROPOSERS["suffix"](SpecOptions.parse({"method": "suffix", "min_hit_rate": 0}))
    assert isinstance(bare, SuffixProposer)
    with pytest.raises(ValueError, match=r"min_hit_rate must lie in \[0, 1\], got 2.0"):
        SpecOptions.parse({"method": "ngram", "min_hit_rate": 2})


def test_proposers_report_the_matched_length() -> None:
    ngram = NgramProposer(min_match=1, max_match=3, steps=2)
    ngram.propose([5, 6, 7, 1, 5, 6], [])
    assert ngram.matched == 2
    ngram.propose([5, 6, 7, 1, 5, 6], [9])
    assert ngram.matched == 0
    suffix = SuffixProposer(min_match=1, max_match=3, steps=2, topk=1)
    suffix.propose([5, 6, 7, 1, 5, 6, 7], [])
    assert suffix.matched == 3
