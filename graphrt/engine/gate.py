"""The gate of a proposer-driven request: drafts are offered only while its guesses pay.

An overlapped round built on drafts that the target then rejects in part is dropped one round
later (:mod:`.spec_ahead`), so a draft costs about a round whenever it misses: drafting pays only
where most guesses hit. The gate scores every chain the proposer makes, offered or not, against
the tokens the request commits later, so it knows when a request copies again without spending a
round on drafts to find out (a request paused by :mod:`.backoff` learns nothing while it sits out).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol


class Guesser(Protocol):
    """What a gate asks of its proposer (:mod:`.proposers`' n-gram and suffix ones)."""

    tokens: Sequence[int]

    def propose(self, prompt: Sequence[int], output: Sequence[int]) -> list[list[int]]: ...

    def peek(
        self, prompt: Sequence[int], output: Sequence[int], tail: Sequence[int], count: int
    ) -> list[int]: ...


#: Weight of each newly scored guess in a gate's hit rate.
GATE_WEIGHT = 0.25
#: Guesses a gate keeps waiting for their tokens (older ones are dropped unscored).
GATE_PENDING = 8


class Gate:
    """A proposer whose drafts are offered only while its recent guesses were right.

    Every chain the proposer makes, offered or not, is kept with the position its first token
    guesses and the tokens assumed before it (``peek``'s tail); once the request's tokens reach
    past it, it is scored: each guessed token up to and including the first wrong one is a
    guess, the right ones hits (a chain whose assumed tail was not committed is dropped). The
    hit rate (an average weighing each newest guess by :data:`GATE_WEIGHT`, from 1.0) must be at
    least ``min_hit_rate`` for :meth:`propose` / :meth:`peek` to return a chain; below it they
    return [] (the row decodes) yet keep scoring, so a request that starts copying again drafts
    again without spending a round to find out.
    """

    def __init__(self, proposer: Guesser, min_hit_rate: float) -> None:
        self.proposer, self.min_hit_rate = proposer, min_hit_rate
        self.rate = 1.0
        #: ``(position of the first guess, tail assumed before it, guessed tokens)``.
        self.pending: list[tuple[int, tuple[int, ...], list[int]]] = []
        #: Positions before this one are scored.
        self.scored = 0
        #: Chains made but not offered (the gate was closed).
        self.withheld = 0

    @property
    def open(self) -> bool:
        """Whether the recent guesses hit often enough for drafts to be offered."""
        return self.rate >= self.min_hit_rate

    def propose(self, prompt: Sequence[int], output: Sequence[int]) -> list[list[int]]:
        """The proposer's branches (the first is the guess kept to score), or [] while closed."""
        branches = self.proposer.propose(prompt, output)
        self._score()
        if branches:
            self._keep(len(self.proposer.tokens), (), branches[0])
        return self._offer(branches)

    def peek(
        self, prompt: Sequence[int], output: Sequence[int], tail: Sequence[int], count: int
    ) -> list[int]:
        """The proposer's peeked chain (kept to score past ``tail``), or [] while closed."""
        chain = self.proposer.peek(prompt, output, tail, count)
        self._score()
        if chain:
            self._keep(len(self.proposer.tokens) + len(tail), tuple(tail), chain)
        return self._offer(chain)

    def _offer(self, made: list) -> list:
        if made and not self.open:
            self.withheld += 1
            return []
        return made

    def _keep(self, start: int, tail: tuple[int, ...], chain: list[int]) -> None:
        self.pending = [*self.pending[1 - GATE_PENDING :], (start, tail, chain)]

    def _score(self) -> None:
        """Score the kept chains the request's tokens now decide, oldest first, each position
        once (chains made a round apart overlap); keep the others."""
        toks, kept = self.proposer.tokens, []
        for item in self.pending:
            start, tail, chain = item
            lt = len(tail)
            known = list(toks[start - lt : start + len(chain)])
            if lt and tuple(known[:lt]) != tail[: len(known)]:
                continue  # NOTE: the round in flight committed other than it assumed
            got = known[lt:]
            if got == chain[: len(got)]:  # NOTE: (a list compare in C) every known guess hit
                if len(got) < len(chain):
                    kept.append(item)  # NOTE: its tokens are not all known yet
                    continue
                hits = len(got)
            else:
                hits = next(i for i, (a, b) in enumerate(zip(got, chain, strict=False)) if a != b)
            missed = hits < len(chain)
            fresh = max(0, start + hits + missed - max(start, self.scored))
            self.scored = max(self.scored, start + hits + missed)
            for hit in ([True] * hits + [False] * missed)[-fresh:] if fresh else ():
                self.rate += GATE_WEIGHT * (hit - self.rate)
        self.pending = kept
