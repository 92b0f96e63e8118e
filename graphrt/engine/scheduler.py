"""One engine step: admit waiting requests, prefill them or decode the running ones, retire.

:class:`Scheduler` holds an :class:`graphrt.Engine`'s requests and steps them (the engine
builds the stack and takes requests). Without overlap a step runs and reads at once; with it
(:mod:`.overlap`) a step launches the next batch and reads the one launched before. DECODE
batches come from :class:`.batches.DecodeRows`, laid out once per running set; a prefill step
replays a MIXED graph where it fits one (:mod:`.prefill`), else runs EXTEND eagerly.
"""

from __future__ import annotations

import functools
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from graphrt.engine.batches import DecodeRows, append_tokens
from graphrt.engine.chunked import plan_step, prefilling
from graphrt.engine.extras import StepExtras
from graphrt.engine.logprobs import wants
from graphrt.engine.lookup import LookupRunner
from graphrt.engine.overlap import Launched, Overlap
from graphrt.engine.pool import Pool
from graphrt.engine.prefill import PrefillGraphs, launch_prefill, run_prefill
from graphrt.engine.request import Request
from graphrt.engine.spec_ahead import SpecAhead
from graphrt.engine.speculative import SpecRunner
from graphrt.engine.step_run import host_sample, read_then_mask, run_mixed, spec_round
from graphrt.engine.step_state import StepCounts
from graphrt.step.modes import ForwardMode


class Scheduler:
    """The running state of an :class:`~graphrt.Engine` and :meth:`step`, which advances it.

    ``waiting``: admitted but not prefilled yet; ``running``: in the batch; ``finished``: done,
    by request id (a caller takes its own out). ``logits``: per request id, the rows an engine
    with ``record_logits`` recorded.
    """

    def __init__(
        self,
        runtime: Any,
        pool: Pool,
        *,
        spec: SpecRunner | LookupRunner | None = None,
        overlap: Overlap | None = None,
        use_graphs: bool = True,
        record_logits: bool = False,
        encode: Callable[[Request], None] | None = None,
        chunk: int | None = None,
    ) -> None:
        self.runtime, self.pool, self.spec, self.overlap = runtime, pool, spec, overlap
        self.encode = encode  # NOTE: an encoder-decoder model's: a request's encoder, at admission
        self.use_graphs, self.record_logits, self.page_size = use_graphs, record_logits, pool.page_size
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.finished: dict[int, Request] = {}
        self.logits: dict[int, list[torch.Tensor]] = {}
        #: The running set's DECODE rows (:class:`DecodeRows`); None whenever the set changes.
        self.rows: DecodeRows | None = None
        self._ended = False  # the last overlapped read ended a request (see take)
        # NOTE: whether a request of rows asked for logprobs / follows a grammar
        self._rows_logprobs = self._rows_constrained = False
        self.extras = StepExtras(runtime)
        self.counts = StepCounts()
        #: Chunked prefill's token budget per step (:mod:`.chunked`); None: whole prompts.
        self.chunk = chunk
        #: A chunked step's mode: MIXED where the runtime captured its graphs, else EXTEND.
        modes = runtime.config.capture_modes
        self.mixed_mode = ForwardMode.MIXED if ForwardMode.MIXED in modes else ForwardMode.EXTEND
        #: Which prefill-only steps replay a MIXED graph (:mod:`.prefill`).
        self.prefill_graphs = PrefillGraphs.of(runtime.config)
        #: Overlapped proposer rounds (:mod:`.spec_ahead`), when the engine overlaps and speculates.
        self.ahead = None
        if overlap is not None and isinstance(spec, LookupRunner):
            rows = runtime.req_to_token.max_reqs
            self.ahead = SpecAhead(spec, overlap, rows, runtime.device, self.prefill_graphs)

    @property
    def lookahead(self) -> int:
        """KV positions a request may write past its last token (a verify's drafts)."""
        return self.spec.lookahead if self.spec else 0

    def step(self) -> list[tuple[int, int]]:
        """One forward: prefill newly admitted requests, else decode the running ones.

        Returns the ``(request id, token)`` pairs produced; with ``overlap`` those of the step
        launched by the call before (one step late).
        """
        if self.overlap is not None:
            return self._step_ahead(self.overlap)
        admitted = self.admit()
        sampled = self.runtime.config.sample and not self.record_logits
        plan = (
            plan_step(self.running, self.chunk, self.page_size, sampled, self.mixed_mode)
            if self.chunk
            else None
        )
        if plan is not None:  # NOTE: chunked prefill (:mod:`.chunked`) while a prompt prefills
            return run_mixed(self, plan)
        if admitted:
            produced = run_prefill(self, admitted, self.prefill_graphs)
            if self.spec is not None:
                self.spec.start([r for r in admitted if not r.done], eager=not self.use_graphs)
        elif self.running and self.spec is None:
            return self._decode_step()
        elif self.running:
            return self._speculate(self.spec)
        else:
            return []
        self.retire([r for r in self.running if r.done])
        return produced

    def _decode_step(self) -> list[tuple[int, int]]:
        rows = self._decode_rows()
        produced, done = self._decode(rows) if rows is not None else ([], [])
        self.retire(done)
        return produced

    def _speculate(self, spec: SpecRunner | LookupRunner) -> list[tuple[int, int]]:
        """A speculative engine's step: a verify round, or a DECODE when no row drafts."""
        reqs = list(self.running)
        proposal = spec.propose(reqs)
        spec.backoff.request_steps += len(reqs)
        if proposal is None:  # NOTE: the plain step: its reads and retirements as plain's
            produced = self._decode_step()
        else:
            produced = spec_round(self, spec, reqs, proposal)
            self.retire([r for r in self.running if r.done])
        spec.backoff.committed += len(produced)
        return produced

    def admit(self) -> list[Request]:
        if not self.waiting:  # NOTE: the decode steady state: nothing to admit
            return []
        admitted = self.pool.admit(self.waiting, self.lookahead)
        if admitted and self.encode is not None:
            for r in admitted:
                self.encode(r)
        if admitted:
            self.running.extend(admitted)
            self.rows = None
        return admitted

    def _decode_rows(self) -> DecodeRows | None:
        """The running requests that still run steps, as :class:`DecodeRows` (kept until a
        request joins, leaves or gives its row back); None when there are none."""
        if self.rows is None:
            reqs = [r for r in self.running if r.req_idx >= 0 and not r.done and not prefilling(r)]
            sampled = self.runtime.config.sample and not self.record_logits
            pending = self.overlap.pending() if self.overlap is not None else frozenset()
            self.rows = DecodeRows(reqs, self.page_size, sampled=sampled, pending=pending) if reqs else None
            self._rows_logprobs = wants(reqs)
            self._rows_constrained = any(r.constraint is not None for r in reqs)
        return self.rows

    def _step_ahead(self, overlap: Overlap) -> list[tuple[int, int]]:
        """Launch the next step, then read the one launched before it (one step late).

        A request that reaches ``max_new_tokens`` gives its row and pages back once its last
        step is launched (stream order keeps them safe for the next occupant), as without
        overlap. One that samples a stop token is seen a step late, so it may have run one
        more step: that token is dropped and the KV it wrote freed with its row.
        """
        if self.ahead is not None:
            return self.ahead.step(self)
        start = time.perf_counter()
        admitted = self.admit()
        eager = not self.use_graphs
        rows = None if admitted else self._decode_rows()
        launched, read = None, []
        if admitted:
            launched = launch_prefill(self, overlap, admitted, self.prefill_graphs)
        elif rows is not None:
            lp, cons, ready = self._rows_logprobs, self._rows_constrained, None
            if cons:  # NOTE: its masks need the step in flight's tokens
                ready = functools.partial(read_then_mask, self, overlap, rows.reqs, read)
            launched = overlap.launch_rows(
                self.runtime, rows, eager=eager, logprobs=lp, constrained=cons, ready=ready
            )
            if launched.finishing is not rows.unfinished:
                for i in np.flatnonzero(launched.finishing):
                    self.release(rows.reqs[i])
        produced, done = self.take(overlap.swap(launched))  # NOTE: nothing where ``read`` holds it
        produced, done = read[0] if read else (produced, done)
        self.retire(done)
        self.counts.step(bool(admitted), rows is not None, start)
        return produced

    def take(self, step: Launched | None) -> tuple[list[tuple[int, int]], list[Request]]:
        """Append a read step's tokens; returns them and the requests they ended.

        A request already done drops its one extra token (a stale row, ``Launched.stale``, its
        token). Only a request that the read before ended can be in a step still in flight (a
        launch leaves out the done ones and those whose budget is launched), so the rows' fast
        path runs unless the last read ended one.
        """
        if step is None:
            return [], []
        tokens = step.read()
        if step.rows is None or step.finishing is None or self._ended or step.stale:
            kept = step.kept(tokens)
            produced = append_tokens([r for r, _ in kept], [t for _, t in kept])
            done = [r for r, _ in kept if r.done]
        else:
            produced = step.rows.append(tokens.tolist())
            done = step.rows.finished(step.finishing, tokens)
        if step.packed is not None or step.constrained:  # NOTE: else nothing to attach
            flags = {"logprobs": step.packed is not None, "constrained": step.constrained}
            self.extras.after(step.reqs, tokens, packed=step.packed, **flags)
        self._ended = bool(done)
        return produced, done

    def mark_prefilled(self, r: Request) -> None:
        """``r``'s whole prompt is in its KV now: its full pages go to the prefix cache."""
        r.prefilled = len(r.prompt)
        self.pool.cache_prompt(r)

    def _decode(self, rows: DecodeRows) -> tuple[list[tuple[int, int]], list[Request]]:
        """One DECODE step of ``rows`` (host input ids); returns its tokens and the requests
        they ended."""
        start = time.perf_counter()
        batch, eager = rows.batch(), not self.use_graphs
        if self._rows_constrained:
            self.extras.before(rows.reqs)
        logits = None
        if rows.sampling is not None:
            tokens = self.runtime.run(batch, eager=eager).cpu().numpy()  # NOTE: syncs: real timing
        else:
            logits = self.runtime.run(batch, eager=eager)
            tokens = np.asarray(host_sample(self, rows.reqs, logits, batch.seq_lens), dtype=np.int64)
        finishing = rows.advance(tokens)
        produced = rows.append(tokens.tolist())
        if self._rows_logprobs or self._rows_constrained:
            flags = {"logprobs": self._rows_logprobs, "constrained": self._rows_constrained}
            self.extras.after(rows.reqs, tokens, logits=logits, **flags)
        self.counts.decoded(start)
        return produced, rows.finished(finishing, tokens)

    def retire(self, done: list[Request]) -> None:
        """Move ``done`` (in running order) from ``running`` to ``finished``."""
        if not done:
            return
        ended = {id(r) for r in done}
        self.running[:] = [r for r in self.running if id(r) not in ended]
        for r in done:
            if r.req_idx >= 0:  # NOTE: an overlapped request may have given its row back already
                self.release(r)
            self.finished[r.rid] = r
        self.rows = None

    def find(self, rid: int) -> Request | None:
        """Request ``rid`` (waiting, running or finished), or None."""
        found = next((r for r in (*reversed(self.waiting), *self.running) if r.rid == rid), None)
        return found or self.finished.get(rid)

    def abort(self, rids: set[int]) -> None:
        """Forget requests ``rids`` wherever they are: waiting, running or finished; a running
        one gives its row (its KV freed) and pages back. A step still in flight may write them:
        the device runs steps in order, and its tokens for a forgotten request are dropped."""
        self.waiting = deque(r for r in self.waiting if r.rid not in rids)
        gone = [r for r in self.running if r.rid in rids]
        self.running[:] = [r for r in self.running if r.rid not in rids]
        for r in gone:
            r.max_new_tokens = len(r.output)  # NOTE: done, so an in-flight read drops its token
            if r.req_idx >= 0:
                self.release(r)
        # NOTE: a step in flight holding them is read on the path that drops done requests
        self._ended = self._ended or bool(gone)
        for rid in rids:
            self.finished.pop(rid, None)
            self.logits.pop(rid, None)
        self.rows = None

    def release(self, r: Request) -> None:
        """Give ``r``'s request row (its KV freed in the ledger) and pages back."""
        self.pool.release(r)
        self.rows = None

    def forget_rows(self) -> None:
        """The running requests' positions moved outside :class:`DecodeRows` (a mixed step, a
        round): the next decode step lays them out anew."""
        self.rows = None
