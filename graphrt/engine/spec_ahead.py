"""Overlapped speculation (``ngram`` / ``suffix`` chains): round n+1 launched before round n is read.

The plain overlapped loop (:mod:`.overlap`) launches step N+1 while step N runs and reads step
N's tokens one step late. A speculative round cannot be built that way exactly: how many tokens
round n commits decides round n+1's positions (KV slots, sequence lengths) and its drafts. So
the host builds round n+1 **assuming round n accepts every draft it offered**, and the device
supplies what it alone knows:

- **Positions, drafts (host, no wait).** A request's round n+1 starts where round n ends if all
  of its ``k`` drafts are accepted (``k + 1`` tokens on). Its drafts come from the proposer's
  :meth:`peek` past round n's drafts: the proposer matches the request's read tokens followed
  by those drafts and returns a chain whose first token guesses round n's bonus token and whose
  rest are round n+1's drafts. Nothing here reads the GPU.
- **The pending token (device).** Node 0 of every request is ``FED``: the TARGET_VERIFY graph
  gathers it from the token feed (``GraphRuntime.tokens``, :mod:`graphrt.runtime.feed`), where
  round n's graph recorded the token after its accepted chain.
- **Back-off (no row drafts).** The round is the plain overlapped loop's own step: the fed
  DECODE of a :class:`~graphrt.engine.batches.DecodeRows` (``Overlap.launch_rows``), read by
  ``Scheduler.take``. While DECODEs follow each other the rows are kept (``sched.rows``) and
  already hold the next positions, so such a round costs the plain step plus the proposers.
- **The fix-up (one round late).** When round n is read and accepted fewer drafts than
  assumed (or stopped), round n+1, already in flight, was built at the wrong positions: its
  tokens for that request are dropped when read, and the request's next round is built exactly
  from its read tokens, its pending token written into the feed first (one small upload, stream
  ordered after the stale round's record). A stale round writes only KV past the request's
  last accepted position, which the exact round rewrites before reading.
- **Sitting out.** A request whose last verify accepted less than all it offered
  (``SpecState.full``) is left out of the round launched while its next verify runs: that
  round would likely be stale for it, and a request left out writes nothing and costs no row.
  When every request sits out, the step reads the verify first and launches the exact round
  after it (that step is not overlapped, and no round of the GPU's is dropped).

Greedy tokens therefore equal plain greedy decoding, and sampled ones plain sampling for the same
seed (each verify node draws with the counter of the position its token takes), whatever was
assumed: a wrong guess costs a round, never a token. Trees (``topk > 1``), draft models and
``tp > 1`` are not overlapped (``overlap.refusal``: a tree's accepted path is moved on the host;
a draft model's next drafts need its DRAFT_EXTEND on the accepted tokens).
"""

from __future__ import annotations

import time

import numpy as np
import torch

from graphrt.buffers.stream import current_stream
from graphrt.engine.batches import DecodeRows, frozen
from graphrt.engine.lookup import LookupRunner
from graphrt.engine.overlap import HostRing, Launched, Overlap
from graphrt.engine.pages import slots_at
from graphrt.engine.prefill import PrefillGraphs, launch_prefill
from graphrt.engine.request import Request
from graphrt.engine.sampling import until_stop
from graphrt.engine.spec_layout import Flight, Layouts, Plan, Round
from graphrt.engine.spec_plan import positions, propose
from graphrt.engine.step_state import StepState
from graphrt.step.batch import Batch
from graphrt.step.modes import ForwardMode


class SpecAhead:
    """The overlapped rounds of one engine (the module docstring says how)."""

    def __init__(
        self, spec: LookupRunner, overlap: Overlap, max_bs: int, device: torch.device, graphs: PrefillGraphs
    ) -> None:
        self.spec, self.overlap, self.device, self.graphs = spec, overlap, device, graphs
        self.steps = spec.geometry.num_steps
        self.ring = HostRing(max_bs * (self.steps + 1), device)
        self.fixes = HostRing(2 * max_bs, device)  # NOTE: the feed fix-up's uploads (pinned)
        self.layouts = Layouts()
        #: ``0 .. steps``: a round's node offsets (read-only); its ``q_lens`` per ``bs``.
        self.nodes = frozen(np.arange(self.steps + 1, dtype=np.int64))
        self._q: dict[int, np.ndarray] = {}
        #: Verifies read, and those that accepted every draft: a request's first verify is
        #: assumed to accept all while at least half of the engine's did (``positions``).
        self.verifies = self.full_verifies = 0

    # ---- one engine step ---------------------------------------------------------------
    def step(self, sched: StepState) -> list[tuple[int, int]]:
        """Launch the next step (a prefill, a round), then read the one launched before it."""
        start, overlap = time.perf_counter(), self.overlap
        admitted = sched.admit()
        launched = self._prefill(sched, admitted) if admitted else self._next(sched)
        previous = overlap.swap(launched)  # type: ignore[arg-type]
        produced, done = self._read(sched, previous)
        sched.retire(done)
        if launched is None and isinstance(previous, Round):
            # NOTE: every row sat out the verify just read: the round after it starts now, exact
            launched = self._next(sched)
            overlap.swap(launched)  # type: ignore[arg-type]
        sched.counts.step(bool(admitted), launched is not None, start)
        return produced

    def _prefill(self, sched: StepState, admitted: list[Request]) -> Launched:
        """The plain overlapped loop's prefill (a MIXED graph's replay where it fits one), then
        each request's proposer and its flight (its first token, in the feed)."""
        launched = launch_prefill(sched, self.overlap, admitted, self.graphs)
        self.spec.start(admitted, eager=not sched.use_graphs)
        for r in admitted:
            r.spec.ahead = Flight(launched, len(r.prompt), ())
        return launched

    # ---- building a round ----------------------------------------------------------------
    def _next(self, sched: StepState) -> Launched | Round | None:
        """The next round: the fed DECODE of the running set's :class:`DecodeRows` when no row
        drafts (the plain overlapped loop's own launch), else a verify."""
        rows, step = sched.rows, self.overlap.inflight
        if rows is not None and isinstance(step, Launched) and step.rows is rows and not step.stale:
            # NOTE: the steady back-off: the DECODE in flight commits one token a row as
            # assumed, so ``rows`` hold the next positions already: only the proposers run
            steps, policy = self.steps, self.spec.options.backoff
            if policy.disable_batch_size and rows.bs > policy.disable_batch_size:
                self.spec.backoff.batch_steps += 1
                return self._decode(sched, rows, sure=True)
            depths = steps if rows.runway > steps else np.minimum(rows.limit - rows.seq_lens - 1, steps)
            chains = propose(rows.reqs, None, depths, steps, self.spec.backoff)
            if chains is None:
                return self._decode(sched, rows, sure=True)
            return self._verify(sched, Plan(self.layouts.get(rows.reqs), rows.seq_lens.tolist(), chains))
        return self._general(sched)

    def _general(self, sched: StepState) -> Launched | Round | None:
        """A round after a prefill, a verify or a stale row: each row's base from its step in
        flight (or its read tokens), then its drafts."""
        policy, counts = self.spec.options.backoff, self.spec.backoff
        live = [r for r in sched.running if not r.done and r.req_idx >= 0]
        prior = 2 * self.full_verifies >= self.verifies
        off = bool(policy.disable_batch_size) and len(live) > policy.disable_batch_size
        reqs, bases, tails, depths, exact = positions(
            live, self.overlap.inflight, 0 if off else self.steps, prior
        )
        if not reqs:
            return None
        counts.batch_steps += off
        chains = propose(reqs, tails, depths, self.steps, counts)
        fixed = [r for r, e in zip(reqs, exact, strict=True) if e]
        if fixed:  # NOTE: their pending tokens, into the feed before the round gathers them
            self._fix_feed(np.array([r.req_idx for r in fixed]), [r.output[-1] for r in fixed])
        if chains is None:
            rows = DecodeRows(reqs, sched.page_size, sampled=True, seq_lens=np.array(bases))
            # NOTE: positions assumed on a verify in flight may be wrong: no row given back early
            return self._decode(sched, rows, sure=not isinstance(self.overlap.inflight, Round))
        return self._verify(sched, Plan(self.layouts.get(reqs), bases, chains))

    def _decode(self, sched: StepState, rows: DecodeRows, *, sure: bool) -> Launched:
        """Launch the fed DECODE of ``rows`` as the plain overlapped loop does. ``sure``: its
        positions are exact (no verify in flight): they become ``sched.rows`` and a request
        whose budget it uses up gives its row back now; else both wait for the reads."""
        launched = self.overlap.launch_rows(sched.runtime, rows, eager=not sched.use_graphs)
        self.spec.backoff.decode_steps += 1
        if not sure:
            launched.finishing = None
            sched.forget_rows()
            return launched
        sched.rows = rows  # NOTE: after the releases below, which forget it: None if one gave its row back
        if launched.finishing is not rows.unfinished:
            for i in np.flatnonzero(launched.finishing):
                sched.release(rows.reqs[i])
        return launched

    def _verify(self, sched: StepState, plan: Plan) -> Round:
        """Launch ``plan``'s TARGET_VERIFY, no wait: node 0 of every row is ``FED``."""
        layout, nodes = plan.layout, self.steps + 1
        reqs, bs = layout.reqs, len(layout.reqs)
        first = np.array(plan.base, dtype=np.int64) - 1  # NOTE: each row's pending position
        batch = Batch.create(
            ForwardMode.TARGET_VERIFY,
            input_ids=plan.input_ids(self.steps),
            seq_lens=first + nodes,
            req_pool_indices=layout.rows,
            out_cache_loc=slots_at(
                layout.table, layout.index[:, None], first[:, None] + self.nodes, sched.page_size
            ).reshape(-1),
            q_lens=self._q_lens(bs),
            sampling=layout.sampling,
        )
        sched.forget_rows()  # NOTE: the rows' positions move by each one's accepted count
        out = sched.runtime.run(batch, eager=not sched.use_graphs, feed=self.overlap.feed.decode)
        host, host_np, event = self.ring.take((bs, nodes))
        host.copy_(out, non_blocking=True)  # NOTE: out is [bs, nodes]: no view (a torch call)
        if event is not None:
            event.record(current_stream(out.device))
        launched = Round(reqs, [], host_np, event)
        flights = launched.flights
        for r, base, chain in zip(reqs, plan.base, plan.chains, strict=True):
            r.spec.ahead = flight = Flight(launched, base, tuple(chain))
            flights.append(flight)
        self.spec.backoff.pad_rows += sum(not c for c in plan.chains)
        return launched

    def _q_lens(self, bs: int) -> np.ndarray:
        """``[bs]`` read-only, every row ``steps + 1`` nodes (made once per ``bs``)."""
        q = self._q.get(bs)
        if q is None:
            q = self._q[bs] = frozen(np.full(bs, self.steps + 1, dtype=np.int64))
        return q

    def _fix_feed(self, rows: np.ndarray, pending: list[int]) -> None:
        """``feed.last[rows] = pending``: one upload of both (a pinned ring buffer), then one
        scatter (stream order: after the stale round's record)."""
        host, view, _ = self.fixes.take((2, rows.size))
        view[0], view[1] = rows, pending
        both = host.to(self.device, non_blocking=True)
        self.overlap.feed.last.index_copy_(0, both[0], both[1])

    # ---- reading a step ------------------------------------------------------------------
    def _read(
        self, sched: StepState, step: Launched | Round | None
    ) -> tuple[list[tuple[int, int]], list[Request]]:
        if step is None:
            return [], []
        if isinstance(step, Round):
            return self._commit(step, step.read())
        if step.rows is not None:  # NOTE: a DECODE: read as the plain loop reads it, stale rows dropped
            stale = sum(id(r) in step.stale and not r.done for r in step.reqs) if step.stale else 0
            produced, done = sched.take(step)
            counts = self.spec.backoff
            counts.request_steps += len(produced) + stale
            counts.stale_rows += stale
            counts.committed += len(produced)
            return produced, done
        produced, done = sched.take(step)  # NOTE: a prefill: its token, as the plain loop reads it
        for r in step.reqs:
            if r.spec.ahead is not None and r.spec.ahead.step is step:
                r.spec.ahead = None
        return produced, done

    def _commit(self, step: Round, predicted: list[list[int]]) -> tuple[list[tuple[int, int]], list[Request]]:
        """Append what each request of ``step`` accepted; mark its row in the step in flight
        stale when it committed other than that step assumed."""
        spec, counts, policy = self.spec, self.spec.backoff, self.spec.options.backoff
        produced, done = [], []
        after = self.overlap.inflight  # NOTE: the step launched after this one
        decoding = isinstance(after, Launched) and after.rows is not None
        for r, f, row in zip(step.reqs, step.flights, predicted, strict=True):
            state = r.spec
            nxt = state.ahead
            if nxt is f:
                state.ahead = nxt = None
            if r.done:
                continue
            counts.request_steps += 1
            if not f.valid:
                counts.stale_rows += 1
                continue
            output = r.output
            assert f.base == len(r.prompt) + len(output), "a valid round starts at the read tokens"
            drafts = f.drafts
            k, a = len(drafts), accepted(drafts, row)
            new = until_stop([*drafts[:a], row[a]], r.sampling)[: r.max_new_tokens - len(output)]
            output.extend(new)
            rid = r.rid
            produced.extend([(rid, t) for t in new])
            counts.committed += len(new)
            if k:
                spec.stats.add(a, k)
                counts.pauses += state.backoff.observe(a, k, policy)
                state.full = a == k
                self.verifies += 1
                self.full_verifies += a == k
            ended = r.done  # NOTE: a property (stop tokens, budget): read once
            if ended:
                done.append(r)
            elif len(new) != k + 1:
                if nxt is not None:
                    nxt.valid = False
                elif decoding:
                    after.stale = after.stale or set()
                    after.stale.add(id(r))
        return produced, done


def accepted(drafts: tuple[int, ...], predicted: list[int]) -> int:
    """Drafts accepted: the longest prefix of ``drafts`` equal to the target's tokens before
    them (``predicted[i]`` follows node ``i``; node 0 is the pending token)."""
    for i, d in enumerate(drafts):
        if d != predicted[i]:
            return i
    return len(drafts)
