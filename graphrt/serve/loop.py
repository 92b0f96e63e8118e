"""The engine thread: one thread owns the engine and serves every request through it.

HTTP handlers (on the asyncio loop) hand a :class:`Job` to :meth:`EngineLoop.submit` — a
thread-safe queue — and get its updates back through the job's ``deliver`` callback (the
server's puts them in :attr:`EngineLoop.outbox`, which the thread flushes once a pass: one
wake-up of the asyncio loop a step, not one a token). The thread drains the queue between
steps: new jobs join the running batch at the next step (continuous batching, graphs replayed
as in ``Engine.step``), cancelled ones leave it with their row and KV pages freed.
A failed step ends the requests in flight and the thread serves on, unless the TP group broke
(:class:`~graphrt.parallel.CollectiveError`): then the thread stops and says so.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from graphrt.parallel import CollectiveError
from graphrt.replies import Replies, Update
from graphrt.serve.outbox import Outbox
from graphrt.step.sampling import SamplingParams

log = logging.getLogger(__name__)

#: Seconds the idle thread waits for a job before it looks at its stop flag again.
IDLE_WAIT_S = 0.5


class ShuttingDown(RuntimeError):
    """What a request still in flight gets when the server stops: a stream ends with
    ``finish_reason: "abort"`` and ``[DONE]``, a whole reply is a ``503``."""


@dataclass(slots=True)
class Job:
    """One request: prompt ids, budget, sampling and stop strings; ``deliver`` receives each
    :class:`~graphrt.replies.Update`, or the ``Exception`` that ended it (from the engine thread)."""

    prompt: list[int]
    max_new_tokens: int
    sampling: SamplingParams | None
    stop: tuple[str, ...]
    deliver: Callable[[Update | Exception], None]
    rid: int | None = None
    cancelled: bool = False
    #: The grammar the reply follows (``graphrt.text.grammar.Constraint``), if any.
    constraint: object = None


@dataclass(frozen=True, slots=True)
class LoopStats:
    """The engine's occupancy after the thread's last pass (what ``GET /health`` reports)."""

    running: int = 0
    waiting: int = 0
    free_rows: int = 0
    rows: int = 0
    free_pages: int = 0
    pages: int = 0
    served: int = 0
    aborted: int = 0
    errors: int = 0
    alive: bool = True
    #: Speculation (zeros without it): drafts offered and accepted, verifies (one per request
    #: per round that drafted), tokens per request per step, requests paused by back-off now.
    spec_drafts: int = 0
    spec_accepted: int = 0
    spec_verifies: int = 0
    spec_tokens_per_round: float = 0.0
    spec_paused: int = 0


def spec_counts(spec: Any, running: list[Any]) -> tuple[int, int, int, float, int]:
    """``LoopStats``' speculation fields from an engine's runner (None: zeros); attribute reads
    and one pass over the running requests, cheap enough for every loop pass."""
    if spec is None:
        return 0, 0, 0, 0.0, 0
    acc, counts = spec.stats, spec.backoff
    paused = sum(r.spec.backoff.paused > 0 for r in running)
    return acc.proposed, acc.accepted, acc.verify_steps, counts.tokens_per_round, paused


@dataclass(slots=True)
class _Counts:
    served: int = 0
    aborted: int = 0
    errors: int = 0
    jobs: dict[int, Job] = field(default_factory=dict)


class EngineLoop:
    """The thread that owns ``replies.engine``: :meth:`start`, :meth:`submit`, :meth:`cancel`,
    :meth:`stop`. Nothing else may touch the engine while it runs.

    ``on_failure`` is called (from the thread) with the error that broke the TP group, after
    which the thread has ended every request and stops; :attr:`failure` keeps the error.
    """

    def __init__(self, replies: Replies, on_failure: Callable[[Exception], None] | None = None) -> None:
        self.replies, self.on_failure = replies, on_failure
        self.failure: Exception | None = None
        #: Where the server's ``deliver`` callbacks queue updates for the asyncio loop.
        self.outbox = Outbox()
        self._inbox: queue.SimpleQueue[tuple[str, Job | None]] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="graphrt-engine", daemon=True)
        self._counts = _Counts()
        self.stats = LoopStats()
        self._publish()

    def start(self) -> None:
        self._thread.start()

    def submit(self, job: Job) -> None:
        """Queue ``job``; a refusal (``ValueError``: too long, bad ids) comes to ``deliver``."""
        if self.failure is not None:  # NOTE: the thread has stopped; nothing would answer
            job.deliver(RuntimeError(f"the engine stopped: {self.failure}"))
            self.outbox.flush()
            return
        self._inbox.put(("add", job))

    def cancel(self, job: Job) -> None:
        """Drop ``job`` wherever it is (queued, waiting or running); nothing more is delivered."""
        job.cancelled = True
        self._inbox.put(("abort", job))

    def stop(self, timeout: float | None = 30.0) -> None:
        """End the thread: running requests get a ``RuntimeError`` and are freed."""
        if self._thread.is_alive():
            self._inbox.put(("stop", None))
            self._thread.join(timeout)

    # ---- the thread ----------------------------------------------------------------------------
    def _run(self) -> None:
        while self.failure is None and self._drain():
            if self.replies.active:
                self._step()
            self.outbox.flush()
            self._publish()
        for job in list(self._counts.jobs.values()):
            self._end(job, ShuttingDown("the server is shutting down"))
        self.outbox.flush()
        self._publish(alive=False)

    def _drain(self) -> bool:
        """Take every queued command (waiting for one when idle); False once asked to stop."""
        block = not self.replies.active
        while True:
            try:
                op, job = self._inbox.get(timeout=IDLE_WAIT_S) if block else self._inbox.get_nowait()
            except queue.Empty:
                return True
            block = False
            if op == "stop":
                return False
            assert job is not None
            if op == "add" and not job.cancelled:
                self._add(job)
            elif op == "abort" and job.rid is not None and job.rid in self._counts.jobs:
                self.replies.abort(job.rid)
                del self._counts.jobs[job.rid]
                self._counts.aborted += 1
            self._publish()

    def _add(self, job: Job) -> None:
        try:
            job.rid = self.replies.add(job.prompt, job.max_new_tokens, job.sampling, job.stop, job.constraint)
        except (ValueError, TypeError) as err:
            job.deliver(err)
            return
        self._counts.jobs[job.rid] = job

    def _step(self) -> None:
        try:
            updates = self.replies.step()
        except Exception as err:  # NOTE: keep serving; every request of the failed step ends
            log.exception("engine step failed; ending the requests in flight")
            self._counts.errors += 1
            for job in list(self._counts.jobs.values()):
                self._end(job, RuntimeError(f"engine step failed: {err}"))
            if isinstance(err, CollectiveError):  # NOTE: no later step can run on a broken group
                self.failure = err
                if self.on_failure is not None:
                    self.on_failure(err)
            return
        for update in updates:
            job = self._counts.jobs.get(update.rid)
            if job is None:
                continue
            if update.done is not None:
                del self._counts.jobs[update.rid]
                self._counts.served += 1
            job.deliver(update)

    def _end(self, job: Job, err: Exception) -> None:
        if job.rid is not None:
            self.replies.abort(job.rid)
            self._counts.jobs.pop(job.rid, None)
        job.deliver(err)

    def _publish(self, alive: bool = True) -> None:
        e, c = self.replies.engine, self._counts
        rows = e.pool.rows
        self.stats = LoopStats(
            len(e.running), len(e.waiting), len(rows), e.runtime.req_to_token.max_reqs,
            e.pool.available, e.kv.dummy_page, c.served, c.aborted, c.errors, alive,
            *spec_counts(e.spec, e.running),
        )  # fmt: skip
