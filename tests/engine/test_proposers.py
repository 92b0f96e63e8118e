"""Proposers (n-gram prompt lookup, suffix trie) and the per-request back-off: exact drafts."""

from __future__ import annotations

import numpy as np
import pytest

from graphrt.engine.backoff import RowBackoff
from graphrt.engine.proposers import NgramProposer, SuffixProposer
from graphrt.engine.spec_options import Backoff, SpecOptions, parse_cli
from graphrt.engine.spec_tree import TreeLayout
from graphrt.step.modes import SpecGeometry


def test_ngram_takes_the_latest_longest_match() -> None:
    p = NgramProposer(min_match=1, max_match=3, steps=3)
    prompt = [5, 6, 7, 1, 2, 5, 6, 8, 9, 4, 5, 6]
    # (5, 6) occurs twice before the end: the latest is followed by 8, 9, 4
    assert p.propose(prompt, []) == [[8, 9, 4]]
    # one token more: the 3-gram (6, 8, ...) is gone, the suffix (5, 6, 8) matched at index 5
    assert p.propose(prompt, [8]) == [[9, 4, 5]]


def test_ngram_without_match_and_below_min_match() -> None:
    p = NgramProposer(min_match=2, max_match=3, steps=2)
    assert p.propose([1, 2, 3, 4], []) == []
    assert p.propose([1, 2, 3, 4], [9]) == []  # (4, 9) is new; a single 9 is below min_match
    assert p.propose([1, 2, 3, 4], [9, 1, 2]) == [[3, 4]]


def test_ngram_copy_runs_into_its_own_output_for_a_loop() -> None:
    p = NgramProposer(min_match=2, max_match=2, steps=5)
    assert p.propose([7, 1, 2, 1, 2], []) == [[1, 2, 1, 2, 1]]


def test_ngram_indexes_incrementally_like_from_scratch() -> None:
    tokens = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3, 2, 3, 8, 4, 6, 2, 6, 4, 3, 3, 8, 3, 2, 7, 9, 5]
    grown = NgramProposer(1, 3, 4)
    for n in range(4, len(tokens)):
        assert grown.propose(tokens[:4], tokens[4:n]) == NgramProposer(1, 3, 4).propose(tokens[:n], [])


def test_suffix_ranks_branches_by_count_and_continues_greedily() -> None:
    prompt = [1, 2, 3, 4, 5, 0, 1, 2, 7, 0, 1, 2, 3, 4, 6, 0, 1, 2]
    # after (1, 2): 3 twice (then 4, then 5 or 6 once each: the lower id), 7 once
    assert SuffixProposer(min_match=1, max_match=2, steps=3, topk=2).propose(prompt, []) == [
        [3, 4, 5],
        [7, 0, 1],
    ]
    # the longer suffix (0, 1, 2) was followed by 7 and by 3 once each: a tie, lower id first
    assert SuffixProposer(min_match=1, max_match=3, steps=3, topk=2).propose(prompt, []) == [
        [3, 4, 6],
        [7, 0, 1],
    ]


def test_suffix_prefers_the_longest_suffix_with_a_continuation() -> None:
    p = SuffixProposer(min_match=1, max_match=3, steps=2, topk=3)
    # (8, 1, 2) occurred once, followed by 9; (1, 2) alone more often by 3
    prompt = [1, 2, 3, 1, 2, 3, 8, 1, 2, 9, 4, 8, 1, 2]
    assert p.propose(prompt, []) == [[9, 4]]
    assert SuffixProposer(2, 2, 2, 3).propose(prompt, []) == [[3, 1], [9, 4]]


def test_suffix_no_match_and_incremental() -> None:
    p = SuffixProposer(min_match=2, max_match=3, steps=2, topk=1)
    assert p.propose([1, 2, 3], []) == []
    assert p.propose([1, 2, 3], [4, 1, 2]) == [[3, 4]]
    assert p.propose([1, 2, 3], [4, 1, 2, 3]) == [[4, 1]]


def test_backoff_pauses_after_low_acceptance_for_a_fixed_number_of_steps() -> None:
    policy = Backoff(min_acceptance=0.3, backoff_rounds=2)
    row = RowBackoff()
    assert not row.observe(0, 4, policy)  # score 0.5
    assert row.observe(0, 4, policy)  # 0.25 < 0.3: pause 2 steps
    assert [row.sits_out() for _ in range(3)] == [True, True, False]
    # paused again: as short as before (an edit's rejected drafts must not pause a copy for long)
    assert not row.observe(0, 4, policy) and row.observe(0, 4, policy) and row.pauses == 2
    assert [row.sits_out() for _ in range(3)] == [True, True, False]
    assert not row.observe(4, 4, policy) and row.score == 1.0


def test_spec_options_are_checked() -> None:
    ngram = SpecOptions.parse({"method": "ngram", "num_steps": 4, "disable_batch_size": 8})
    assert (ngram.method, ngram.geometry.num_draft_tokens, ngram.backoff.disable_batch_size) == (
        "ngram",
        5,
        8,
    )
    with pytest.raises(
        ValueError, match=r"method must be one of \('draft_model', 'ngram', 'suffix'\), got 'eagle'"
    ):
        SpecOptions.parse({"method": "eagle"})
    with pytest.raises(
        ValueError, match=r"unknown speculative option\(s\) \['draft_model'\] for method 'ngram'"
    ):
        SpecOptions.parse({"method": "ngram", "draft_model": "tiny-llama"})
    with pytest.raises(ValueError, match="the ngram method drafts a chain: topk must be 1, got 2"):
        SpecOptions.parse({"method": "ngram", "topk": 2})
    with pytest.raises(ValueError, match="need 1 <= min_match <= max_match, got min_match 3, max_match 2"):
        SpecOptions.parse({"method": "suffix", "min_match": 3, "max_match": 2})
    with pytest.raises(ValueError, match=r"min_acceptance must lie in \[0, 1\], got 1.5"):
        SpecOptions.parse({"method": "suffix", "min_acceptance": 1.5})


def test_cli_text() -> None:
    assert parse_cli("ngram") == {"method": "ngram"}
    assert parse_cli("method=suffix,num_steps=4,min_acceptance=0.5") == {
        "method": "suffix",
        "num_steps": 4,
        "min_acceptance": 0.5,
    }
    with pytest.raises(ValueError, match="expected key=value, got 'topk'"):
        parse_cli("method=suffix,topk")


def test_pad_drafts_never_match() -> None:
    tree = TreeLayout.of(SpecGeometry(3, 2))  # nodes: 0 | 1 2 3 (branch 0) | 4 5 6 (branch 1)
    drafts = np.array([[[4, 5, 6], [7, 8, 9]]] * 2)
    predicted = np.array([[7, 5, 6, 1, 8, 9, 2]] * 2)  # branch 1 matches whole
    valid = np.ones_like(drafts, dtype=bool)
    valid[1, 1, 2] = False  # row 1: branch 1 was proposed two tokens deep
    acc = tree.accept(drafts, predicted, valid)
    assert acc.branch.tolist() == [1, 1] and acc.length.tolist() == [3, 2]
    assert acc.bonus.tolist() == [2, 9]  # after node 6 / after node 5


def test_suffix_peek_guesses_the_bonus_and_a_full_chain_of_drafts() -> None:
    # an overlapped round peeks steps + 1 tokens (the bonus of the round in flight, then its
    # drafts): the trie holds substrings long enough for the longest match to give them all
    suffix = SuffixProposer(min_match=1, max_match=1, steps=2, topk=1)
    assert suffix.peek([1, 2, 3, 4, 5, 1], [], (), 3) == [2, 3, 4]
    assert suffix.propose([1, 2, 3, 4, 5, 1], []) == [[2, 3]]


def _trie(node: object) -> dict:
    """A suffix trie as nested ``{token: (count, children)}`` (comparable with ``==``)."""
    return {t: (c.count, _trie(c)) for t, c in node.children.items()}  # type: ignore[attr-defined]


#: A request's tokens with repeats (copies to index) and runs of new tokens.
GROWN = [int(t) for t in np.random.default_rng(3).integers(0, 6, 90)]
#: Tokens each step commits: a round's 1 .. steps + 1 (its accepted drafts and bonus), or 1.
CHUNKS = [1, 5, 2, 1, 1, 4, 5, 3, 1, 5, 2, 2, 1, 5, 5, 1, 3]


@pytest.mark.parametrize("method", ["ngram", "suffix"])
def test_the_incremental_index_equals_a_rebuild(method: str) -> None:
    """Grown by rounds of 1 .. 5 tokens, peeking past tails not indexed between them, a
    proposer's index (n-gram tables; suffix trie counts) and answers equal one built from all
    the tokens at once: a round indexes its new tokens only, and a peek indexes nothing."""

    def make() -> NgramProposer | SuffixProposer:
        return NgramProposer(2, 5, 4) if method == "ngram" else SuffixProposer(2, 5, 4, 2)

    prompt, grown, n = GROWN[:12], make(), 12
    for chunk in CHUNKS:
        n = min(n + chunk, len(GROWN))
        output, tail = GROWN[12:n], tuple(GROWN[n : n + 3])
        peeked = grown.peek(prompt, output, tail, 5)  # NOTE: indexes output, never the tail
        rebuilt = make()
        assert rebuilt.peek(GROWN[:n], [], tail, 5) == peeked
        assert grown.propose(prompt, output) == rebuilt.propose(GROWN[:n], [])
        assert grown.tokens == rebuilt.tokens == GROWN[:n]
        if isinstance(grown, NgramProposer):
            assert grown.index == rebuilt.index  # type: ignore[union-attr]
        else:
            assert _trie(grown.root) == _trie(rebuilt.root)  # type: ignore[union-attr]
            counts = [[a.count for a in p.active] for p in (grown, rebuilt)]  # type: ignore[union-attr]
            assert counts[0] == counts[1] and len(counts[0]) > 2  # NOTE: the matched suffixes' nodes
