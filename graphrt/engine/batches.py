"""The batches the engine runs: a prefill of newly admitted requests, a decode of running ones.

Requests are ``engine.request.Request`` objects, typed ``Any`` here as in ``pages`` and
``speculative``: ``request`` imports the speculative runner, which builds its prefill here.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from graphrt.engine.pages import page_table, slots_at
from graphrt.engine.sampling import row_params
from graphrt.step.batch import FED, Batch
from graphrt.step.modes import ForwardMode
from graphrt.step.sampling import SamplingParams


def prefill_batch(
    reqs: Sequence[Any],
    page_size: int,
    sampling: tuple[SamplingParams, ...] | None = None,
    tokens: Sequence[Sequence[int]] | None = None,
) -> Batch:
    """EXTEND: every prompt token of ``reqs`` (or ``tokens``, one list per request, KV from
    position 0). A request's first ``Request.cached`` prompt positions are a prefix-cache hit
    already in its row: the step computes the rest (``q_lens < seq_lens``) and reads those."""
    if tokens is None:
        starts = [r.cached for r in reqs]
        tokens = [r.prompt[s:] for r, s in zip(reqs, starts, strict=True)]
    else:
        starts = [0] * len(reqs)
    q_lens = [len(t) for t in tokens]
    lens = [s + q for s, q in zip(starts, q_lens, strict=True)]
    locs = [r.slots(s, n, page_size) for r, s, n in zip(reqs, starts, lens, strict=True)]
    return Batch.create(
        ForwardMode.EXTEND,
        input_ids=np.concatenate(tokens),
        seq_lens=lens,
        req_pool_indices=[r.req_idx for r in reqs],
        out_cache_loc=np.concatenate(locs),
        q_lens=q_lens,
        sampling=sampling,
    )


def append_tokens(reqs: Sequence[Any], tokens: list[int]) -> list[tuple[int, int]]:
    """Append ``tokens[i]`` to ``reqs[i]``'s output; the ``(request id, token)`` pairs."""
    for r, t in zip(reqs, tokens, strict=True):
        r.output.append(t)
    return [(r.rid, t) for r, t in zip(reqs, tokens, strict=True)]


def _frozen(arr: np.ndarray) -> np.ndarray:
    """``arr`` made read-only: it is shared by every batch of the rows until they change."""
    arr.flags.writeable = False
    return arr


class DecodeRows:
    """DECODE batches for one list of running requests, laid out once and advanced each step.

    The running set of continuous batching changes only when a request joins or leaves; in
    between, every step writes the next position of the same rows. So the request rows, page
    table, sampling parameters, budgets and stop tokens become arrays once (``O(bs)`` Python,
    when the set changes), and a step costs a few numpy operations instead of loops over the
    requests: :meth:`batch`, then :meth:`advance` once the step is launched.

    ``sampled``: the batches carry ``Batch.sampling`` (the runtime samples in its program).

    NOTE: the arrays a batch holds are never written afterwards (read-only or replaced by new
    ones), so a batch cannot change under the runtime once it was checked.
    """

    def __init__(self, reqs: list[Any], page_size: int, *, sampled: bool) -> None:
        bs = len(reqs)
        self.reqs, self.page_size = reqs, page_size
        self.rows = _frozen(np.array([r.req_idx for r in reqs], dtype=np.int64))
        self.pages = page_table(reqs)
        self.index = np.arange(bs)
        #: The next step's KV length per request: its tokens read or in flight, plus the new one.
        self.seq_lens = _frozen(
            np.array([len(r.prompt) + len(r.output) + r.inflight for r in reqs], dtype=np.int64)
        )
        #: ``seq_lens`` at which a request's budget is used up (no step needs to run).
        self.limit = np.array([len(r.prompt) + r.max_new_tokens for r in reqs], dtype=np.int64)
        #: The next step's input ids when the host gives them: each request's last read token.
        self.last = _frozen(np.array([r.output[-1] if r.output else 0 for r in reqs], dtype=np.int64))
        #: A fed step's input ids: ``FED`` (the device gathers each row's token in the graph).
        self.fed = _frozen(np.full(bs, FED, dtype=np.int64))
        self.sampling = row_params([r.sampling for r in reqs]) if sampled else None
        stops = [r.sampling.stop_token_ids if r.sampling is not None else () for r in reqs]
        most = max((len(s) for s in stops), default=0)
        #: ``[bs, most]`` stop token ids, -1 padded (never a token); None: no request has any.
        self.stops: np.ndarray | None = None
        if most:
            self.stops = np.full((bs, most), -1, dtype=np.int64)
            for i, s in enumerate(stops):
                self.stops[i, : len(s)] = s

    @property
    def bs(self) -> int:
        return len(self.reqs)

    def batch(self, *, fed: bool = False) -> Batch:
        """The next DECODE step: one token per request at position ``seq_lens - 1``.

        ``fed``: the input ids come from the device (:mod:`graphrt.runtime.feed`); the host
        gives ``FED`` placeholders (``Batch.check(fed=True)`` wants exactly those).
        """
        locs = slots_at(self.pages, self.index, self.seq_lens - 1, self.page_size)
        return Batch.create(
            ForwardMode.DECODE,
            input_ids=self.fed if fed else self.last,
            seq_lens=self.seq_lens,
            req_pool_indices=self.rows,
            out_cache_loc=locs,
            sampling=self.sampling,
        )

    def advance(self, tokens: np.ndarray | None = None) -> np.ndarray:
        """After the step of :meth:`batch` is launched: move every request one position on.

        ``tokens``: the step's tokens when read (the next step's host input ids). Returns the
        mask of requests whose budget that step used up (its token is their last).
        """
        self.seq_lens = _frozen(self.seq_lens + 1)
        if tokens is not None:
            self.last = _frozen(tokens.astype(np.int64, copy=True))
        return self.seq_lens >= self.limit

    def append(self, tokens: list[int]) -> list[tuple[int, int]]:
        """Append a step's ``tokens`` (one per request, in order); the ``(rid, token)`` pairs."""
        return append_tokens(self.reqs, tokens)

    def finished(self, finishing: np.ndarray, tokens: np.ndarray) -> list[Any]:
        """The requests a step ended: ``finishing`` (from :meth:`advance`), or whose token in
        ``tokens [bs]`` is one of their stop tokens (``Request.done``, without a loop)."""
        if self.stops is not None:
            finishing = finishing | (self.stops == tokens[:, None]).any(axis=1)
        if not finishing.any():  # NOTE: the usual step: nothing ends, no index list to build
            return []
        return [self.reqs[i] for i in np.flatnonzero(finishing)]
