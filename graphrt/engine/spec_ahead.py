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
  round n's graph recorded the token after its accepted chain. A fed DECODE (a step where no
  request drafts: back-off) reads and records the same feed.
- **The fix-up (one round late).** When round n is read and accepted fewer drafts than
  assumed (or stopped), round n+1, already in flight, was built at the wrong positions: its
  tokens for that request are dropped when read, and the request's next round is built exactly
  from its read tokens, its pending token written into the feed first (one small upload, stream
  ordered after the stale round's record). A stale round writes only KV past the request's
  last accepted position, which the exact round rewrites before reading.

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
from graphrt.engine.batches import prefill_batch
from graphrt.engine.logprobs import wants
from graphrt.engine.lookup import LookupRunner
from graphrt.engine.overlap import HostRing, Launched, Overlap
from graphrt.engine.pages import slots_at
from graphrt.engine.request import Request
from graphrt.engine.sampling import row_params, until_stop
from graphrt.engine.spec_layout import Flight, Layouts, Plan, Round
from graphrt.engine.step_state import StepState
from graphrt.step.batch import FED, PAD_DRAFT, Batch
from graphrt.step.modes import ForwardMode


class SpecAhead:
    """The overlapped rounds of one engine (the module docstring says how)."""

    def __init__(self, spec: LookupRunner, overlap: Overlap, max_bs: int, device: torch.device) -> None:
        self.spec, self.overlap, self.device = spec, overlap, device
        self.steps = spec.geometry.num_steps
        self.ring = HostRing(max_bs * (self.steps + 1), device)
        self.layouts = Layouts(self.steps)

    # ---- one engine step ---------------------------------------------------------------
    def step(self, sched: StepState) -> list[tuple[int, int]]:
        """Launch the next step (a prefill, a round), then read the one launched before it."""
        start, overlap = time.perf_counter(), self.overlap
        admitted = sched.admit()
        launched: Launched | Round | None = None
        if admitted:
            launched = self._prefill(sched, admitted)
        else:
            plan = self._plan([r for r in sched.running if not r.done and r.req_idx >= 0])
            launched = self._launch(sched, plan) if plan is not None else None
        previous = overlap.swap(launched)  # type: ignore[arg-type]
        produced, done = self._read(sched, previous)
        sched.retire(done)
        sched.counts.step(bool(admitted), launched is not None, start)
        return produced

    def _prefill(self, sched: StepState, admitted: list[Request]) -> Launched:
        sched.extras.before(admitted, fresh=True)
        batch = prefill_batch(admitted, sched.page_size, row_params([r.sampling for r in admitted]))
        eager = not sched.use_graphs
        launched = self.overlap.launch(
            sched.runtime, batch, admitted, eager=eager, fed=False, logprobs=wants(admitted)
        )
        self.spec.start(admitted, eager=eager)
        for r in admitted:
            sched.mark_prefilled(r)
            r.spec.ahead = Flight(launched, len(r.prompt), ())
            if r.launched_all:
                sched.release(r)
        return launched

    # ---- building a round ----------------------------------------------------------------
    def _plan(self, reqs: list[Request]) -> Plan | None:
        """Each request's base and drafts, assuming its step in flight accepts all it offered."""
        counts, policy = self.spec.backoff, self.spec.options.backoff
        off = bool(policy.disable_batch_size) and len(reqs) > policy.disable_batch_size
        rows, bases, chains, exact = [], [], [], []
        steps, propose = self.steps, self._propose
        for r in reqs:
            f = r.spec.ahead
            fresh = f is None or not f.valid
            base = len(r.prompt) + len(r.output) if fresh else f.base + len(f.drafts) + 1
            left = r.max_new_tokens - (base - len(r.prompt))
            if left <= 0:
                continue  # NOTE: the step in flight ends it if it accepts all; else a later round
            depth = 0 if off else min(steps, left - 1)
            chain: list[int] = []
            if depth > 0 and r.spec.backoff.sits_out():
                counts.paused_rows += 1
            elif depth > 0:
                chain = propose(r, None if fresh else f.drafts)[:depth]
                counts.no_match_rows += not chain
            rows.append(r)
            bases.append(base)
            chains.append(chain)
            exact.append(fresh)
        if not rows:
            return None
        counts.batch_steps += off
        layout = self.layouts.get(rows)
        drafts = layout.pads  # NOTE: a backed-off step (no row drafts) builds no drafts array
        if any(chains):
            drafts = np.array([c + [PAD_DRAFT] * (steps - len(c)) for c in chains], dtype=np.int64)
        return Plan(layout, np.array(bases, dtype=np.int64), drafts, np.array(exact))

    def _propose(self, r: Request, tail: tuple[int, ...] | None) -> list[int]:
        """Drafts after ``r``'s read tokens (``tail`` None), or past its step in flight: the
        peeked chain's first token guesses that step's last token, the rest are the drafts."""
        proposer = r.spec.proposer
        if tail is None:
            branches = proposer.propose(r.prompt, r.output)
            return branches[0] if branches else []
        return proposer.peek(r.prompt, r.output, tail, self.steps + 1)[1:]

    def _launch(self, sched: StepState, plan: Plan) -> Round:
        """Fix the exact rows' pending tokens in the feed, then launch the round, no wait."""
        layout = plan.layout
        reqs, bs, rows = layout.reqs, len(layout.reqs), layout.rows
        if plan.exact.any():
            self._fix_feed(
                rows[plan.exact], [r.output[-1] for r, e in zip(reqs, plan.exact, strict=True) if e]
            )
        verify = plan.drafts is not layout.pads
        nodes = self.steps + 1 if verify else 1
        if verify:
            pos = plan.base[:, None] - 1 + np.arange(nodes)
            ids = np.concatenate([np.full((bs, 1), FED), plan.drafts], axis=1).reshape(-1)
            slots = slots_at(layout.table, layout.index[:, None], pos, sched.page_size).reshape(-1)
        else:  # NOTE: a backed-off step: a fed DECODE on the layout's arrays
            ids, slots = layout.fed, slots_at(layout.table, layout.index, plan.base - 1, sched.page_size)
        batch = Batch.create(
            ForwardMode.TARGET_VERIFY if verify else ForwardMode.DECODE,
            input_ids=ids,
            seq_lens=plan.base - 1 + nodes,
            req_pool_indices=rows,
            out_cache_loc=slots,
            q_lens=np.full(bs, nodes) if verify else None,
            sampling=layout.sampling,
        )
        counts = self.spec.backoff
        counts.decode_steps += not verify
        counts.pad_rows += int((plan.offered == 0).sum()) if verify else 0
        out = sched.runtime.run(batch, eager=not sched.use_graphs, feed=self.overlap.feed.decode)
        host, host_np, event = self.ring.take((bs, nodes))
        host.copy_(out.view(bs, nodes), non_blocking=True)
        if event is not None:
            event.record(current_stream(out.device))
        launched = Round(reqs, layout, [], host_np, event)
        if verify:
            drafts = [tuple(t for t in d if t != PAD_DRAFT) for d in plan.drafts.tolist()]
        else:
            drafts = [()] * bs
        launched.flights = flights = [
            Flight(launched, base, d) for base, d in zip(plan.base.tolist(), drafts, strict=True)
        ]
        for r, flight in zip(reqs, flights, strict=True):
            r.spec.ahead = flight
        return launched

    def _fix_feed(self, rows: np.ndarray, pending: list[int]) -> None:
        """``feed.last[rows] = pending``: one upload of both, then one scatter (stream order: after
        the stale round's record)."""
        cuda = self.device.type == "cuda"
        both = torch.tensor(np.stack([rows, np.asarray(pending, dtype=np.int64)]), dtype=torch.int64)
        both = both.pin_memory() if cuda else both  # NOTE: pinned: the copy does not stall the host
        both = both.to(self.device, non_blocking=True)
        self.overlap.feed.last.index_copy_(0, both[0], both[1])

    # ---- reading a step ------------------------------------------------------------------
    def _read(
        self, sched: StepState, step: Launched | Round | None
    ) -> tuple[list[tuple[int, int]], list[Request]]:
        if step is None:
            return [], []
        if isinstance(step, Launched):  # a prefill: its token, as the plain loop reads it
            produced, done = sched.take(step)
            for r in step.reqs:
                if r.spec.ahead is not None and r.spec.ahead.step is step:
                    r.spec.ahead = None
            return produced, done
        predicted = step.read()
        if predicted.shape[1] == 1:
            return self._commit_decode(step, predicted[:, 0].tolist())
        return self._commit(step, predicted)

    def _commit_decode(self, step: Round, tokens: list[int]) -> tuple[list[tuple[int, int]], list[Request]]:
        """:meth:`_commit` for a fed DECODE (a backed-off step): one token per request, none
        offered, so a valid row commits its token and the round after it stays valid (a valid
        row's budget is not spent: :meth:`_plan` left out those whose budget was)."""
        counts = self.spec.backoff
        produced, done, stale = [], [], 0
        for r, f, t, (budget, stops) in zip(step.reqs, step.flights, tokens, step.layout.ends, strict=True):
            if r.spec.ahead is f:
                r.spec.ahead = None
            if r.done:  # NOTE: ended by the read before (or aborted): its token is dropped
                continue
            if not f.valid:
                stale += 1
                continue
            out = r.output
            out.append(t)
            produced.append((r.rid, t))
            if len(out) >= budget or t in stops:
                done.append(r)
        counts.request_steps += len(produced) + stale
        counts.stale_rows += stale
        counts.committed += len(produced)
        return produced, done

    def _commit(self, step: Round, predicted: np.ndarray) -> tuple[list[tuple[int, int]], list[Request]]:
        """Append what each request of ``step`` accepted; mark its round in flight stale when it
        committed other than the ``k + 1`` tokens that round assumed."""
        spec, counts, policy = self.spec, self.spec.backoff, self.spec.options.backoff
        produced, done, lengths, offered = [], [], [], []
        for i, (r, f) in enumerate(zip(step.reqs, step.flights, strict=True)):
            nxt = r.spec.ahead
            if nxt is f:
                r.spec.ahead = nxt = None
            if r.done:
                continue
            counts.request_steps += 1
            if not f.valid:
                counts.stale_rows += 1
                continue
            assert f.base == len(r.prompt) + len(r.output), "a valid round starts at the read tokens"
            k, row = len(f.drafts), predicted[i]
            a = int(np.cumprod(np.asarray(f.drafts) == row[:k]).sum()) if k else 0
            new = until_stop([*f.drafts[:a], int(row[a])], r.sampling)[: r.max_new_tokens - len(r.output)]
            r.output.extend(new)
            produced.extend((r.rid, t) for t in new)
            counts.committed += len(new)
            if k:
                lengths.append(a)
                offered.append(k)
                counts.pauses += r.spec.backoff.observe(a, k, policy)
            if nxt is not None and len(new) != k + 1:
                nxt.valid = False
            if r.done:
                done.append(r)
        if lengths:
            spec.stats.count(np.array(lengths), np.array(offered))
        return produced, done
