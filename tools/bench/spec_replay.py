"""Proposer speculation replayed on the host over known greedy continuations: no model runs.

Greedy tokens do not depend on speculation, so a request's rounds follow from its prompt, its
greedy continuation and the policy alone. :func:`replay` runs the engine's own proposer, gate
and back-off (:data:`graphrt.engine.proposers.PROPOSERS`, :class:`~graphrt.engine.backoff.RowBackoff`)
as the engine schedules one request: synchronous rounds (:mod:`graphrt.engine.lookup`) or
overlapped ones (:mod:`graphrt.engine.spec_ahead`: round n+1 built assuming round n accepts every
draft it offered, dropped as stale when it did not; a request whose last verify fell short sits
out the round launched during its next one). :func:`oracle` says what a perfect gate
would get: a round drafts exactly the proposer's tokens that the target then commits.

Usage: ``python -m graphrt.tools.bench.spec_replay TOKENS.json [--speculative key=value,...]``,
``TOKENS.json`` a list of ``{"prompt": [ids], "output": [ids]}`` (plain greedy tokens, e.g. in
fp32 on the CPU, as many as the run to predict generates).
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from graphrt.engine.backoff import RowBackoff
from graphrt.engine.gate import Gate
from graphrt.engine.proposers import PROPOSERS
from graphrt.engine.spec_options import SpecOptions, parse_cli

#: Kinds of round: drafts verified; a DECODE as the proposer had no match, its gate withheld
#: the chain (:mod:`graphrt.engine.gate`) or the request was paused; a stale round.
KINDS = ("drafted", "no_match", "gated", "paused", "stale")


@dataclass(slots=True)
class Rounds:
    """One request's rounds: ``kinds`` counted, drafts offered and accepted, tokens committed."""

    kinds: Counter = field(default_factory=Counter)
    offered: int = 0
    accepted: int = 0
    zero_accept: int = 0
    tokens: int = 0

    def add(self, kind: str, committed: int, offered: int = 0, accepted: int = 0) -> None:
        self.kinds[kind] += 1
        self.tokens += committed
        self.offered, self.accepted = self.offered + offered, self.accepted + accepted
        self.zero_accept += offered > 0 and accepted == 0

    def summary(self) -> dict[str, Any]:
        rounds = sum(self.kinds.values())
        out: dict[str, Any] = {"rounds": rounds, "tokens": self.tokens}
        out |= {"offered": self.offered, "accepted": self.accepted}
        out |= {k: self.kinds[k] for k in KINDS} | {"zero_accept": self.zero_accept}
        out["tokens_per_round"] = self.tokens / rounds if rounds else 0.0
        out["acceptance"] = self.accepted / self.offered if self.offered else 0.0
        return out


def _withheld(proposer: Any) -> int:
    """Chains a gated proposer made but did not offer so far (0: not gated)."""
    return proposer.withheld if isinstance(proposer, Gate) else 0


def _accepted(chain: Sequence[int], greedy: Sequence[int], at: int) -> int:
    a = 0
    while a < len(chain) and at + a < len(greedy) and chain[a] == greedy[at + a]:
        a += 1
    return a


def replay_sync(prompt: list[int], greedy: list[int], options: SpecOptions) -> Rounds:
    """Synchronous rounds (:class:`~graphrt.engine.lookup.LookupRunner`) of one request whose
    greedy tokens are ``greedy`` (the prefill commits the first)."""
    proposer, row, policy = PROPOSERS[options.method](options), RowBackoff(), options.backoff
    steps, end, out, rounds = options.geometry.num_steps, len(greedy), list(greedy[:1]), Rounds()
    while len(out) < end:
        depth = min(steps, end - len(out) - 1)
        if depth > 0 and row.sits_out():
            rounds.add("paused", 1)
            out.append(greedy[len(out)])
            continue
        withheld = _withheld(proposer)
        branches = proposer.propose(prompt, out) if depth > 0 else []
        if not branches:
            rounds.add("gated" if _withheld(proposer) > withheld else "no_match", 1)
            out.append(greedy[len(out)])
            continue
        chain = branches[0][:depth]
        a = _accepted(chain, greedy, len(out))
        out.extend(greedy[len(out) : len(out) + a + 1])
        row.observe(a, len(chain), policy)
        rounds.add("drafted", a + 1, len(chain), a)
    return rounds


@dataclass(slots=True)
class _Flight:
    base: int
    drafts: tuple[int, ...]
    kind: str = "no_match"
    valid: bool = True


def _plan(
    proposer: Any, row: RowBackoff, prompt: list[int], out: list[int], f: _Flight, steps: int, end: int
) -> _Flight | None:
    """The round launched while ``f`` is in flight (:meth:`SpecAhead._plan` for one request)."""
    fresh = not f.valid
    base = len(prompt) + len(out) if fresh else f.base + len(f.drafts) + 1
    left = end - (base - len(prompt))
    if left <= 0:
        return None
    depth, chain, kind, withheld = min(steps, left - 1), [], "no_match", _withheld(proposer)
    if depth > 0 and row.sits_out():
        kind = "paused"
    elif depth > 0 and fresh:
        branches = proposer.propose(prompt, out)
        chain = branches[0][:depth] if branches else []
    elif depth > 0:
        chain = proposer.peek(prompt, out, f.drafts, steps + 1)[1 : depth + 1]
    kind = "gated" if _withheld(proposer) > withheld else kind
    return _Flight(base, tuple(chain), "drafted" if chain else kind)


def replay_overlap(prompt: list[int], greedy: list[int], options: SpecOptions) -> Rounds:
    """Overlapped rounds (:class:`~graphrt.engine.spec_ahead.SpecAhead`) of one request. As the
    engine, a request whose last verify accepted less than all (before its first: fewer than half
    of the verifies accepted all) sits out the round launched during its next verify, which is
    read first: the exact round is launched after it."""
    proposer, row, policy = PROPOSERS[options.method](options), RowBackoff(), options.backoff
    steps, end, out, rounds = options.geometry.num_steps, len(greedy), [], Rounds()
    flight: _Flight | None = _Flight(len(prompt), ())  # NOTE: the prefill, read one step late
    full: bool | None = None
    verifies = full_verifies = 0
    while flight is not None and len(out) < end:
        prior = 2 * full_verifies >= verifies
        sits = bool(out) and flight.valid and bool(flight.drafts) and not (prior if full is None else full)
        launched = None if sits else _plan(proposer, row, prompt, out, flight, steps, end)
        if not out:
            out.append(greedy[0])  # the prefill's token
        elif not flight.valid:
            rounds.add("stale", 0)
        else:
            k = len(flight.drafts)
            a = _accepted(flight.drafts, greedy, len(out))
            out.extend(greedy[len(out) : len(out) + a + 1])
            rounds.add(flight.kind, a + 1, k, a)
            if k:
                row.observe(a, k, policy)
                full, verifies, full_verifies = a == k, verifies + 1, full_verifies + (a == k)
            if launched is not None and a < k:
                launched.valid = False
        if sits and len(out) < end:
            launched = _plan(proposer, row, prompt, out, _Flight(0, (), valid=False), steps, end)
        flight = launched
    return rounds


def replay(prompt: list[int], greedy: list[int], options: SpecOptions, overlap: bool) -> Rounds:
    """One request's rounds, overlapped or synchronous."""
    return (replay_overlap if overlap else replay_sync)(prompt, greedy, options)


def oracle(prompt: list[int], greedy: list[int], options: SpecOptions) -> dict[str, float]:
    """What the proposer could give: the share of tokens its (ungated) chain's first token
    predicts, and the tokens per round of a perfect gate (each round offers exactly the
    proposer's tokens the target commits, so no round is stale)."""
    bare = SpecOptions.parse({"method": options.method, "min_hit_rate": 0.0} | _shape(options))
    proposer, steps = PROPOSERS[options.method](bare), options.geometry.num_steps
    predicted, i, rounds = 0, 1, 0  # NOTE: as :func:`replay`, the prefill's token is no round's
    for j in range(1, len(greedy)):
        branches = proposer.propose(prompt, greedy[:j])
        hits = _accepted(branches[0][:steps], greedy, j) if branches else 0
        predicted += hits > 0
        if j == i:
            i, rounds = i + min(hits, len(greedy) - j - 1) + 1, rounds + 1
    tokens = len(greedy) - 1
    return {"predicted": predicted / max(1, tokens), "tokens_per_round": tokens / max(1, rounds)}


def _shape(options: SpecOptions) -> dict[str, int]:
    g = options.geometry
    return {
        "num_steps": g.num_steps,
        "topk": g.topk,
        "min_match": options.min_match,
        "max_match": options.max_match,
    }


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("tokens", type=Path, help="JSON list of {prompt, output} token ids")
    parser.add_argument("--method", default="ngram,suffix")
    parser.add_argument("--speculative", default="num_steps=4", help="key=value options (bench-spec's)")
    args = parser.parse_args(argv)
    records = json.loads(args.tokens.read_text())
    for method in args.method.split(","):
        options = SpecOptions.parse(parse_cli(args.speculative) | {"method": method})
        for i, rec in enumerate(records):
            best = oracle(rec["prompt"], rec["output"], options)
            print(
                f"{method} #{i} oracle: predicted {best['predicted']:.2f}, {best['tokens_per_round']:.2f} tokens/round"
            )
            for overlap in (True, False):
                s = replay(rec["prompt"], rec["output"], options, overlap).summary()
                print(
                    f"  {'overlap' if overlap else 'sync   '} {json.dumps({k: round(v, 3) for k, v in s.items()})}"
                )


if __name__ == "__main__":
    main()
