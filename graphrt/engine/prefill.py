"""Prefill-only steps: whole prompts of newly admitted requests, replayed as a MIXED graph
when they fit one.

A prefill step's batch is varlen: each request computes the prompt tokens after its prefix-cache
hit (``q_lens <= seq_lens``, :func:`.batches.prefill_batch`). That is the shape of a chunked
step without decode rows (:mod:`.chunked`), so a runtime that captured MIXED graphs (per token
bucket: ``RuntimeConfig.token_buckets``, from ``EngineConfig.prefill_graph_tokens`` or
``prefill_chunk``) replays one for it: one metadata write and one launch instead of an eager
forward, whose host cost is what remains of a short prefill's time to first token. The MIXED
program is the EXTEND one (its head on each request's last token, sampled in the program with
the same penalties, token masks and log-probabilities), so the tokens are the eager prefill's.
A batch larger than the largest token bucket runs EXTEND eagerly, as before (no fallback
counted: it was never meant for a graph).

Whether an engine's runtime graphs MIXED at all is :func:`.graphable.graphable`'s decision
(an encoder-decoder model or a backend without MIXED, as sparse MLA's, cannot): where not,
prefill and chunked steps run EXTEND eagerly.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from graphrt.engine.batches import prefill_batch
from graphrt.engine.logprobs import wants
from graphrt.engine.overlap import Launched, Overlap
from graphrt.engine.request import Request
from graphrt.engine.sampling import row_params
from graphrt.engine.step_run import run_and_sample
from graphrt.engine.step_state import StepState
from graphrt.step.batch import Batch
from graphrt.step.config import RuntimeConfig
from graphrt.step.modes import ForwardMode


@dataclass(frozen=True, slots=True)
class PrefillGraphs:
    """Which prefill batches replay a MIXED graph: those of at most ``largest`` query tokens
    (the largest token bucket; 0: the runtime graphs no MIXED) and ``max_rows`` requests (a
    bucket of ``T >= bs`` tokens holds ``min(T, max_batch_size)`` requests)."""

    largest: int
    max_rows: int

    @classmethod
    def of(cls, config: RuntimeConfig) -> PrefillGraphs:
        """From the runtime's config (its capture modes and token buckets)."""
        graphed = ForwardMode.MIXED in config.capture_modes and bool(config.token_buckets)
        return cls(config.token_buckets[-1] if graphed else 0, config.max_batch_size)

    def fits(self, batch: Batch) -> bool:
        """Whether ``batch`` (a prefill) fits a captured MIXED graph."""
        return batch.num_tokens <= self.largest and batch.bs <= self.max_rows

    def batch(self, batch: Batch) -> Batch:
        """``batch`` (an EXTEND prefill) as MIXED when it fits a graph, else as it is."""
        return dataclasses.replace(batch, mode=ForwardMode.MIXED) if self.fits(batch) else batch


def run_prefill(sched: StepState, reqs: list[Request], graphs: PrefillGraphs) -> list[tuple[int, int]]:
    """Prefill ``reqs`` (their prompts after each one's cached prefix), read at once; appends
    and returns each request's first token."""
    batch = graphs.batch(prefill_batch(reqs, sched.page_size))
    sched.extras.before(reqs, fresh=True)
    produced = run_and_sample(sched, reqs, batch)
    for r in reqs:
        sched.mark_prefilled(r)
    sched.counts.prefill_steps += 1
    return produced


def launch_prefill(
    sched: StepState, overlap: Overlap, reqs: list[Request], graphs: PrefillGraphs
) -> Launched:
    """The overlapped prefill of ``reqs``, launched (its tokens recorded in the feed, read a
    step later); a request whose budget it uses up gives its row back now."""
    sched.extras.before(reqs, fresh=True)
    batch = graphs.batch(prefill_batch(reqs, sched.page_size, row_params([r.sampling for r in reqs])))
    eager = not sched.use_graphs
    launched = overlap.launch(sched.runtime, batch, reqs, eager=eager, fed=False, logprobs=wants(reqs))
    for r in reqs:
        sched.mark_prefilled(r)  # NOTE: before a release: the cache's pin needs its live KV
        if r.launched_all:
            sched.release(r)
    return launched
