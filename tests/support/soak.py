"""A seeded continuous-batching workload for the soak test: good steps and bad batches.

Rows are request slots of ``req_to_token``; row ``r`` owns the contiguous pages of
``tests.support.util.slot_of``, so a good step never writes a slot of another row. The workload keeps
its own view of each live row's valid length (checked against the runtime's ledger by the
test) and proposes, per step, one of: arrivals (EXTEND from position 0 into free rows, or a
chunk appended to a live row), a finish (``ReqToToken.free``), DECODE over a random subset of
live rows (any bs, so every bucket and the eager fallback past the largest), TARGET_VERIFY,
DRAFT_EXTEND (ragged, sometimes rewriting its own tail), DRAFT_DECODE (chain), IDLE, or a bad
batch built to break exactly one rule.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from graphrt import Batch, ForwardMode
from graphrt.step.modes import SpecGeometry
from tests.support.soak_bad import BadSteps
from tests.support.util import Setup, slot_of

M = ForwardMode


@dataclass(frozen=True, slots=True)
class Step:
    """One step of the workload: a batch to run, or a row to free (``batch is None``)."""

    kind: str
    batch: Batch | None = None
    free_row: int = -1
    error: type[Exception] | None = None  # set: a bad batch, refused with this error
    message: str = ""  # regex the refusal's message matches


@dataclass
class Workload:
    """Proposes steps for a runtime of ``max_reqs`` rows, ``context`` positions, ``page`` size."""

    rng: np.random.Generator
    max_reqs: int
    context: int
    page: int
    vocab: int
    spec: SpecGeometry
    lens: dict[int, int] = field(default_factory=dict)  # live row -> valid length

    # ---- good steps ----------------------------------------------------------------------
    def step(self, setup: Setup, bad_rate: float) -> Step:
        if self.rng.random() < bad_rate:
            bad = BadSteps(self).bad(setup)
            if bad is not None:
                return bad
        kinds: list[tuple[str, float, Callable[[Setup], Step | None]]] = [
            ("arrive", 0.14, self.arrive),
            ("chunk", 0.04, self.chunk),
            ("finish", 0.08, self.finish),
            ("decode", 0.40, self.decode),
            ("verify", 0.12, self.verify),
            ("draft_extend", 0.10, self.draft_extend),
            ("draft_decode", 0.08, self.draft_decode),
            ("idle", 0.04, lambda s: self._idle()),
        ]
        weights = np.array([w for _, w, _ in kinds])
        while True:
            _, _, make = kinds[int(self.rng.choice(len(kinds), p=weights / weights.sum()))]
            proposed = make(setup)
            if proposed is not None:
                return proposed

    def commit(self, step: Step) -> None:
        """Record what a good step leaves valid (the ledger's rule: start + q per row)."""
        if step.batch is None:
            self.lens.pop(step.free_row, None)
            return
        b = step.batch
        if b.mode is M.IDLE:
            return
        for row, seq_len in zip(b.req_pool_indices.tolist(), b.seq_lens.tolist(), strict=True):
            # NOTE: DRAFT_DECODE writes seq_len - 1 .. + draft_forwards - 1 (a chain).
            extra = self.spec.draft_forwards - 1 if b.mode is M.DRAFT_DECODE else 0
            self.lens[row] = seq_len + extra

    def arrive(self, s: Setup) -> Step | None:
        free = [r for r in range(self.max_reqs) if r not in self.lens]
        if not free:
            return None
        rows = self._pick(free, int(self.rng.integers(1, min(3, len(free)) + 1)))
        lens = [int(self.rng.integers(1, self.context // 2)) for _ in rows]
        return Step("arrive", self._extend(s, rows, [0] * len(rows), lens))

    def chunk(self, s: Setup) -> Step | None:
        rows = self._live(room=2)
        if not rows:
            return None
        row = self._pick(rows, 1)[0]
        start = self.lens[row]
        q = int(self.rng.integers(1, min(16, self.context - start) + 1))
        return Step("chunk", self._extend(s, [row], [start], [q]))

    def finish(self, s: Setup) -> Step | None:
        if not self.lens:
            return None
        return Step("finish", free_row=self._pick(sorted(self.lens), 1)[0])

    def decode(self, s: Setup) -> Step | None:
        rows = self._live(room=1)
        if not rows:
            return None
        rows = self._pick(rows, int(self.rng.integers(1, len(rows) + 1)))
        return Step("decode", self._writes(s, M.DECODE, rows, [self.lens[r] for r in rows], [1] * len(rows)))

    def verify(self, s: Setup) -> Step | None:
        n = self.spec.num_draft_tokens
        rows = self._live(room=n)
        if not rows:
            return None
        rows = self._pick(rows, int(self.rng.integers(1, len(rows) + 1)))
        starts = [self.lens[r] for r in rows]
        return Step("verify", self._writes(s, M.TARGET_VERIFY, rows, starts, [n] * len(rows)))

    def draft_extend(self, s: Setup) -> Step | None:
        """Accepted tokens, ragged; a start below the valid length rewrites the row's own tail."""
        n = self.spec.num_draft_tokens
        rows = self._live(room=n)
        if not rows:
            return None
        rows = self._pick(rows, int(self.rng.integers(1, len(rows) + 1)))
        starts = [self.lens[r] - int(self.rng.integers(0, min(self.lens[r], n) + 1)) for r in rows]
        qs = [int(self.rng.integers(1, n + 1)) for _ in rows]
        return Step("draft_extend", self._writes(s, M.DRAFT_EXTEND, rows, starts, qs))

    def draft_decode(self, s: Setup) -> Step | None:
        steps = self.spec.draft_forwards
        rows = self._live(room=steps)
        if not rows:
            return None
        rows = self._pick(rows, int(self.rng.integers(1, len(rows) + 1)))
        batch = Batch.create(
            M.DRAFT_DECODE,
            input_ids=self.rng.integers(0, self.vocab, len(rows)),
            seq_lens=[self.lens[r] + 1 for r in rows],
            req_pool_indices=rows,
            out_cache_loc=[slot_of(s, r, self.lens[r] + i) for r in rows for i in range(steps)],
            q_lens=[1] * len(rows),
        )
        return Step("draft_decode", batch)

    def _idle(self) -> Step:
        empty: list[int] = []
        return Step(
            "idle",
            Batch.create(
                M.IDLE, input_ids=empty, seq_lens=empty, req_pool_indices=empty, out_cache_loc=empty
            ),
        )

    # ---- helpers ---------------------------------------------------------------------------
    def _live(self, room: int) -> list[int]:
        """Live rows that can take ``room`` more positions."""
        return [r for r in sorted(self.lens) if self.lens[r] + room <= self.context]

    def _pick(self, rows: list[int], k: int) -> list[int]:
        return [int(r) for r in self.rng.choice(rows, size=k, replace=False)]

    def _extend(self, s: Setup, rows: list[int], starts: list[int], qs: list[int]) -> Batch:
        return self._writes(s, M.EXTEND, rows, starts, qs)

    def _writes(
        self, s: Setup, mode: ForwardMode, rows: list[int], starts: list[int], qs: list[int]
    ) -> Batch:
        """A ``mode`` batch: row ``rows[i]`` writes positions ``starts[i] .. + qs[i] - 1``."""
        return Batch.create(
            mode,
            input_ids=self.rng.integers(0, self.vocab, int(sum(qs))),
            seq_lens=[a + q for a, q in zip(starts, qs, strict=True)],
            req_pool_indices=rows,
            out_cache_loc=[
                slot_of(s, r, p) for r, a, q in zip(rows, starts, qs, strict=True) for p in range(a, a + q)
            ],
            q_lens=qs,
        )
