"""The batches the engine runs: a prefill of newly admitted requests, a decode of running ones.

Requests are ``engine.request.Request`` objects, typed ``Any`` here as in ``pages`` and
``speculative``: ``request`` imports the speculative runner, which builds its prefill here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

from graphrt.engine.pages import page_table
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


def frozen(arr: np.ndarray) -> np.ndarray:
    """``arr`` made read-only: every batch of a running set shares it until the set changes."""
    arr.flags.writeable = False
    return arr


_Arrays = TypeVar("_Arrays", bound="RunningArrays")


@dataclass(frozen=True, slots=True)
class RunningArrays:
    """The arrays every batch of one running set (``reqs``, in batch order) shares, made once
    (``O(bs)`` Python, when the set changes) instead of loops over the requests each step.

    ``rows [bs]`` int64 request rows; ``table [bs, pages]`` int64 their page table
    (:func:`~graphrt.engine.pages.page_table`); ``index [bs]`` ``0 .. bs-1`` (all read-only);
    ``sampling`` their sampling parameters, None unless ``sampled``.
    """

    reqs: list[Any]
    rows: np.ndarray
    table: np.ndarray
    index: np.ndarray
    sampling: tuple[SamplingParams, ...] | None

    @classmethod
    def of(cls: type[_Arrays], reqs: Sequence[Any], *, sampled: bool) -> _Arrays:
        """``reqs``' arrays (a copy of the list; ``sampled``: with their sampling parameters)."""
        return cls(
            reqs=list(reqs),
            rows=frozen(np.array([r.req_idx for r in reqs], dtype=np.int64)),
            table=frozen(page_table(reqs)),
            index=frozen(np.arange(len(reqs))),
            sampling=row_params([r.sampling for r in reqs]) if sampled else None,
        )


#: Decode steps whose KV slots :class:`DecodeRows` lays out at once (a ``[SLOT_STEPS, bs]``
#: block, one row per step): a step then takes a row instead of five numpy operations.
SLOT_STEPS = 32


class DecodeRows:
    """DECODE batches for one list of running requests, laid out once and advanced each step.

    The running set of continuous batching changes only when a request joins or leaves; in
    between, every step writes the next position of the same rows. So the request rows, page
    table and sampling parameters (:class:`RunningArrays`), budgets and stop tokens become
    arrays once (``O(bs)`` Python, when the set changes), and a step costs a few numpy
    operations instead of loops over the requests: :meth:`batch`, then :meth:`advance` once
    the step is launched.

    ``sampled``: the batches carry ``Batch.sampling`` (the runtime samples in its program).
    ``pending``: ids (``id(request)``) of requests with one more token in flight than their
    ``Request.inflight`` counts (the overlapped engine's fed step in flight). ``seq_lens``
    ``[bs]``: the first step's KV lengths when the caller knows them (overlapped speculative
    rounds: :mod:`.spec_ahead`); default: each request's tokens, read or in flight, plus one.

    NOTE: the arrays a batch holds are never written afterwards (read-only or replaced by new
    ones), so a batch cannot change under the runtime once it was checked.
    """

    def __init__(
        self,
        reqs: list[Any],
        page_size: int,
        *,
        sampled: bool,
        pending: frozenset[int] | set[int] = frozenset(),
        seq_lens: np.ndarray | None = None,
    ) -> None:
        bs = len(reqs)
        self.arrays, self.page_size = RunningArrays.of(reqs, sampled=sampled), page_size
        #: The next step's KV length per request: its tokens read or in flight, plus the new one.
        if seq_lens is None:
            seq_lens = [len(r.prompt) + len(r.output) + r.inflight + (id(r) in pending) for r in reqs]
        self.seq_lens = frozen(np.array(seq_lens, dtype=np.int64))  # NOTE: a copy: frozen
        #: ``seq_lens`` at which a request's budget is used up (no step needs to run).
        self.limit = np.array([len(r.prompt) + r.max_new_tokens for r in reqs], dtype=np.int64)
        #: Steps :meth:`advance` takes before a budget can run out (none ends before: no mask).
        self._runway = int((self.limit - self.seq_lens).min()) if bs else 0
        #: What :meth:`advance` returns while no budget runs out (read-only, all False).
        self.unfinished = frozen(np.zeros(bs, dtype=bool))
        #: The next step's input ids when the host gives them: each request's last read token.
        self.last = frozen(np.array([r.output[-1] if r.output else 0 for r in reqs], dtype=np.int64))
        #: A fed step's input ids: ``FED`` (the device gathers each row's token in the graph).
        self.fed = frozen(np.full(bs, FED, dtype=np.int64))
        # NOTE: a step's tokens are appended through bound methods: no attribute lookups per
        # request (``Request.output`` is never replaced while the request runs).
        self._appends = [r.output.append for r in reqs]
        self._rids = [r.rid for r in reqs]
        stops = [r.sampling.stop_token_ids if r.sampling is not None else () for r in reqs]
        most = max((len(s) for s in stops), default=0)
        #: ``[bs, most]`` stop token ids, -1 padded (never a token); None: no request has any.
        self.stops: np.ndarray | None = None
        if most:
            self.stops = np.full((bs, most), -1, dtype=np.int64)
            for i, s in enumerate(stops):
                self.stops[i, : len(s)] = s
        self._slots = self._slots_ahead()
        self._step = 0  # NOTE: the row of ``_slots`` the next batch takes

    @property
    def reqs(self) -> list[Any]:
        """The running requests, in batch order."""
        return self.arrays.reqs

    @property
    def sampling(self) -> tuple[SamplingParams, ...] | None:
        """The batches' ``Batch.sampling`` (None unless ``sampled``)."""
        return self.arrays.sampling

    @property
    def bs(self) -> int:
        return len(self.arrays.reqs)

    @property
    def runway(self) -> int:
        """Steps every request can still take: ``min(limit - seq_lens)`` (0 when empty)."""
        return self._runway

    def _slots_ahead(self) -> np.ndarray:
        """``[SLOT_STEPS, bs]`` read-only: row ``k`` holds the KV slots of positions
        ``seq_lens - 1 + k``; a position past a request's pages gets -1 (never a slot: the
        runtime's checks refuse it; no step reaches one within the request's budget)."""
        pos = (self.seq_lens - 1)[None, :] + np.arange(SLOT_STEPS)[:, None]
        page = pos // self.page_size
        table = self.arrays.table
        width = table.shape[1]
        slots = table[self.arrays.index[None, :], np.minimum(page, width - 1)] * self.page_size
        slots += pos % self.page_size
        slots[page >= width] = -1
        return frozen(slots)

    def batch(self, *, fed: bool = False) -> Batch:
        """The next DECODE step: one token per request at position ``seq_lens - 1``.

        ``fed``: the input ids come from the device (:mod:`graphrt.runtime.feed`); the host
        gives ``FED`` placeholders (``Batch.check(fed=True)`` wants exactly those).
        """
        if self._step == SLOT_STEPS:
            self._slots, self._step = self._slots_ahead(), 0
        return Batch.create(
            ForwardMode.DECODE,
            input_ids=self.fed if fed else self.last,
            seq_lens=self.seq_lens,
            req_pool_indices=self.arrays.rows,
            out_cache_loc=self._slots[self._step],
            sampling=self.sampling,
        )

    def advance(self, tokens: np.ndarray | None = None) -> np.ndarray:
        """After the step of :meth:`batch` is launched: move every request one position on.

        ``tokens``: the step's tokens when read (the next step's host input ids). Returns the
        mask of requests whose budget that step used up (its token is their last); while
        none does, :attr:`unfinished` itself.
        """
        self.seq_lens = frozen(self.seq_lens + 1)
        self._step += 1
        self._runway -= 1
        if tokens is not None:
            self.last = frozen(tokens.astype(np.int64, copy=True))
        if self._runway > 0:
            return self.unfinished
        return self.seq_lens >= self.limit

    def append(self, tokens: list[int]) -> list[tuple[int, int]]:
        """Append a step's ``tokens`` (one per request, in order); the ``(rid, token)`` pairs."""
        for add, t in zip(self._appends, tokens, strict=True):
            add(t)
        return list(zip(self._rids, tokens, strict=True))

    def finished(self, finishing: np.ndarray, tokens: np.ndarray) -> list[Any]:
        """The requests a step ended: ``finishing`` (from :meth:`advance`), or whose token in
        ``tokens [bs]`` is one of their stop tokens (``Request.done``, without a loop)."""
        if self.stops is not None:
            finishing = finishing | (self.stops == tokens[:, None]).any(axis=1)
        elif finishing is self.unfinished:  # NOTE: the usual step: nothing ends, no reduction
            return []
        if not finishing.any():
            return []
        return [self.reqs[i] for i in np.flatnonzero(finishing)]
