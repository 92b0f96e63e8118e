"""A step's run and draw: prefill and mixed (chunked) steps, proposer rounds, and the host
sampler for engines that record logits; functions of the scheduler that runs them, seen as its
:class:`~graphrt.engine.step_state.StepState`."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from graphrt.engine.batches import append_tokens
from graphrt.engine.chunked import MixedStep, prefilling
from graphrt.engine.logprobs import wants
from graphrt.engine.lookup import LookupRunner
from graphrt.engine.overlap import Overlap
from graphrt.engine.request import Request
from graphrt.engine.sampling import host_tokens, row_params, until_stop
from graphrt.engine.speculative import SpecRunner
from graphrt.engine.step_state import StepState
from graphrt.step.batch import Batch


def run_mixed(sched: StepState, plan: MixedStep) -> list[tuple[int, int]]:
    """Run a chunked step (decode rows and prompt chunks in one MIXED or EXTEND batch); append
    the tokens of its decode rows and finished prompts (their log-probabilities and grammar
    states as on DECODE and EXTEND steps), retire the requests done."""
    start, eager = time.perf_counter(), not sched.use_graphs
    emitting = [r for r, e in zip(plan.reqs, plan.emits, strict=True) if e]
    # NOTE: a prompt's last chunk samples its first token: its mask and counts start now
    # (an earlier chunk's dropped draw counted in its row is wiped)
    sched.extras.before(plan.starting, fresh=True)
    sched.extras.before(plan.reqs[: plan.decodes])  # NOTE: the constrained decode rows' masks
    logits = None
    if plan.batch.sampling is not None:
        tokens = sched.runtime.run(plan.batch, eager=eager).cpu().numpy()[plan.emits].tolist()
    else:
        logits = sched.runtime.run(plan.batch, eager=eager)[np.flatnonzero(plan.emits)]  # NOTE: last rows
        tokens = host_sample(sched, emitting, logits, plan.batch.seq_lens[plan.emits])
    for r, q in zip(plan.reqs, plan.chunks.tolist(), strict=True):
        r.prefilled += q
        if q and not prefilling(r):
            sched.mark_prefilled(r)
    sched.forget_rows()  # NOTE: the decode rows moved on outside DecodeRows
    counts = sched.counts
    if plan.decodes:  # NOTE: a mixed step counts as one of the decode rows' steps
        counts.mixed_steps += 1
        counts.decode_seconds += time.perf_counter() - start
    else:
        counts.prefill_steps += 1
    produced = append_tokens(emitting, tokens)
    ids = np.asarray(tokens, dtype=np.int64)
    flags = {"logprobs": wants(emitting), "constrained": True}
    sched.extras.after(emitting, ids, rows=plan.emits, logits=logits, **flags)
    sched.retire([r for r in sched.running if r.done])
    return produced


def spec_round(
    sched: StepState, spec: SpecRunner | LookupRunner, reqs: list[Request], proposal: Any
) -> list[tuple[int, int]]:
    """Run ``spec``'s round for ``reqs`` on ``proposal`` and append what each committed."""
    start = time.perf_counter()
    new = spec.round(reqs, proposal, eager=not sched.use_graphs)
    sched.forget_rows()  # NOTE: the rows' positions moved by a round's own count each
    sched.counts.decoded(start)
    new = [until_stop(tokens, r.sampling) for r, tokens in zip(reqs, new, strict=True)]
    for r, tokens in zip(reqs, new, strict=True):
        r.output.extend(tokens)
    return [(r.rid, t) for r, tokens in zip(reqs, new, strict=True) for t in tokens]


def run_and_sample(sched: StepState, reqs: list[Request], batch: Batch) -> list[tuple[int, int]]:
    """Run ``batch`` (a prefill) and append each request's next token.

    The runtime samples inside its program; an engine recording logits takes them and
    applies the same sampler here, so its tokens are the same.
    """
    eager = not sched.use_graphs
    logits = None
    if sched.runtime.config.sample and not sched.record_logits:
        batch = dataclasses.replace(batch, sampling=row_params([r.sampling for r in reqs]))
        tokens = sched.runtime.run(batch, eager=eager).tolist()
    else:
        logits = sched.runtime.run(batch, eager=eager)  # NOTE: [bs, V]: each request's last row
        tokens = host_sample(sched, reqs, logits, batch.seq_lens)
    produced = append_tokens(reqs, tokens)
    ids = np.asarray(tokens, dtype=np.int64)
    sched.extras.after(reqs, ids, logprobs=wants(reqs), constrained=True, logits=logits)
    return produced


def host_sample(
    sched: StepState, reqs: list[Request], logits: torch.Tensor, seq_lens: np.ndarray
) -> list[int]:
    """Each request's token from its row of ``logits`` (recorded when asked); ``seq_lens``:
    their KV lengths (the sampler's positions)."""
    tokens = host_tokens(logits, [r.sampling for r in reqs], seq_lens)
    if sched.record_logits:
        for r, row in zip(reqs, logits.float().cpu(), strict=True):
            sched.logits.setdefault(r.rid, []).append(row)
    return tokens


def read_then_mask(state: StepState, overlap: Overlap, reqs: Sequence[Request], out: list[Any]) -> None:
    """A constrained DECODE of ``reqs``, its metadata written (the ``ready`` of
    ``GraphRuntime.run``): read the step in flight (its tokens accepted by the grammars;
    ``state.take``'s answer appended to ``out``), then write the masks of ``reqs``. Graphed on
    a runtime with token masks, this runs while the step's forward graph runs and before its
    sampler graph (graphrt/runtime/split_pairs.py); else before the step's launch.

    A request its token just ended runs this step on its last mask (which allowed that token,
    so it is never empty); the token it samples is dropped, as any overlapped step's is.
    """
    out.append(state.take(overlap.swap(None)))
    done = out[-1][1]
    state.extras.before([r for r in reqs if not r.done] if done else reqs)
