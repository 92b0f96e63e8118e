"""The batches the engine runs: a prefill of newly admitted requests, a decode of running ones."""

from __future__ import annotations

import numpy as np

from graphrt.engine.request import Request
from graphrt.step.batch import Batch
from graphrt.step.modes import ForwardMode


def prefill_batch(reqs: list[Request], page_size: int) -> Batch:
    """EXTEND: every prompt token of ``reqs``, KV from position 0."""
    lens = [len(r.prompt) for r in reqs]
    return Batch.create(
        ForwardMode.EXTEND,
        input_ids=np.concatenate([r.prompt for r in reqs]),
        seq_lens=lens,
        req_pool_indices=[r.req_idx for r in reqs],
        out_cache_loc=np.concatenate([r.slots(0, n, page_size) for r, n in zip(reqs, lens, strict=True)]),
        q_lens=lens,
    )


def decode_batch(reqs: list[Request], page_size: int, *, fed: bool = False) -> Batch:
    """DECODE: one token per request, its last one (read, or still in flight).

    ``fed``: the input ids come from the device (:mod:`graphrt.runtime.feed`); the host writes
    placeholder zeros, which pass the vocabulary check the host still runs.
    """
    seq_lens = [len(r.prompt) + len(r.output) + r.inflight for r in reqs]
    # NOTE: plain ints, not one numpy call per request: this runs on the host every step.
    locs = [
        r.pages[(n - 1) // page_size] * page_size + (n - 1) % page_size
        for r, n in zip(reqs, seq_lens, strict=True)
    ]
    return Batch.create(
        ForwardMode.DECODE,
        input_ids=np.zeros(len(reqs), dtype=np.int64) if fed else [r.output[-1] for r in reqs],
        seq_lens=seq_lens,
        req_pool_indices=[r.req_idx for r in reqs],
        out_cache_loc=locs,
    )
