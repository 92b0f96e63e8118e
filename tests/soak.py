"""A seeded continuous-batching workload for the soak test: good steps and bad batches.

Rows are request slots of ``req_to_token``; row ``r`` owns the contiguous pages of
``tests.util.slot_of``, so a good step never writes a slot of another row. The workload keeps
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
from graphrt.kv.ledger import KVIsolationError
from graphrt.step.modes import SpecGeometry
from tests.util import Setup, remade, slot_of

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
            bad = self.bad(setup)
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

    # ---- bad batches: each breaks one rule -------------------------------------------------
    def bad(self, s: Setup) -> Step | None:
        makers = [
            self._bad_token,
            self._bad_foreign_slot,
            self._bad_read_past_valid,
            self._bad_freed_row,
            self._bad_too_large,
            self._bad_duplicate_rows,
            self._bad_duplicate_slots,
            self._bad_misaligned,
            self._bad_past_context,
            self._bad_row_range,
            self._bad_dummy_page,
            self._bad_verify_token,
            self._bad_draft_extend_q,
        ]
        for i in self.rng.permutation(len(makers)):
            made = makers[int(i)](s)
            if made is not None:
                return made
        return None

    def _good_decode(self, s: Setup, at_least: int = 1) -> Batch | None:
        rows = self._live(room=1)
        if len(rows) < at_least:
            return None
        rows = self._pick(rows, int(self.rng.integers(at_least, len(rows) + 1)))
        return self._writes(s, M.DECODE, rows, [self.lens[r] for r in rows], [1] * len(rows))

    def _bad_token(self, s: Setup) -> Step | None:
        b = self._good_decode(s)
        if b is None:
            return None
        ids = b.input_ids.copy()
        bad = int(self.rng.choice([self.vocab, self.vocab + 77, -1]))
        ids[int(self.rng.integers(0, ids.size))] = bad
        return self._bad(
            "token", remade(b, input_ids=ids), ValueError, rf"token id out of range.*{bad} not in"
        )

    def _bad_foreign_slot(self, s: Setup) -> Step | None:
        """Row ``r`` writes a page-aligned slot that live row ``o`` holds."""
        for r in self.rng.permutation(self._live(room=1)).tolist():
            pos = self.lens[r]
            for o in self.rng.permutation(sorted(self.lens)).tolist():
                # NOTE: positions of row o that share the page offset of r's next position.
                held = list(range(pos % self.page, self.lens[o], self.page))
                if o == r or not held:
                    continue
                slot = slot_of(s, o, held[int(self.rng.integers(0, len(held)))])
                b = Batch.create(
                    M.DECODE, input_ids=[1], seq_lens=[pos + 1], req_pool_indices=[r], out_cache_loc=[slot]
                )
                return self._bad(
                    "foreign_slot", b, KVIsolationError, rf"slot {slot} holds position \d+ of live row {o}"
                )
        return None

    def _bad_read_past_valid(self, s: Setup) -> Step | None:
        rows = self._live(room=3)
        if not rows:
            return None
        r = self._pick(rows, 1)[0]
        seq = int(self.rng.integers(self.lens[r] + 2, self.context + 1))
        b = self._writes(s, M.DECODE, [r], [seq - 1], [1])
        return self._bad(
            "read_past_valid", b, KVIsolationError, rf"\(row {r}\) reads KV positions 0\.\.{seq - 2}"
        )

    def _bad_freed_row(self, s: Setup) -> Step | None:
        free = [r for r in range(self.max_reqs) if r not in self.lens]
        if not free:
            return None
        r = self._pick(free, 1)[0]
        seq = int(self.rng.integers(2, self.context + 1))
        b = self._writes(s, M.DECODE, [r], [seq - 1], [1])
        return self._bad("freed_row", b, KVIsolationError, rf"\(row {r}\).*written only 0")

    def _bad_too_large(self, s: Setup) -> Step | None:
        bs = self.max_reqs + 1
        b = Batch.create(
            M.DECODE,
            input_ids=[1] * bs,
            seq_lens=[1] * bs,
            req_pool_indices=list(range(bs)),
            out_cache_loc=[slot_of(s, r, 0) for r in range(bs)],
        )
        return self._bad("too_large", b, ValueError, rf"batch too large: bs {bs} > max_reqs {self.max_reqs}")

    def _bad_duplicate_rows(self, s: Setup) -> Step | None:
        b = self._good_decode(s)
        if b is None:
            return None
        rows = np.concatenate([b.req_pool_indices, b.req_pool_indices[:1]])
        seq = np.concatenate([b.seq_lens, b.seq_lens[:1]])
        locs = np.concatenate([b.out_cache_loc, b.out_cache_loc[:1]])
        bad = remade(
            b,
            req_pool_indices=rows,
            seq_lens=seq,
            out_cache_loc=locs,
            input_ids=np.ones(rows.size, np.int64),
            q_lens=None,
        )
        return self._bad("duplicate_rows", bad, ValueError, rf"distinct.*row {int(rows[0])} appears 2 times")

    def _bad_duplicate_slots(self, s: Setup) -> Step | None:
        b = self._good_decode(s, at_least=2)
        if b is None:
            return None
        locs = b.out_cache_loc.copy()
        locs[-1] = locs[0]
        return self._bad(
            "duplicate_slots", remade(b, out_cache_loc=locs), ValueError, r"out_cache_loc must be distinct"
        )

    def _bad_misaligned(self, s: Setup) -> Step | None:
        b = self._good_decode(s)
        if b is None:
            return None
        i = int(self.rng.integers(0, b.bs))
        locs = b.out_cache_loc.copy()
        locs[i] += 1 if locs[i] % self.page < self.page - 1 else -1
        return self._bad("misaligned", remade(b, out_cache_loc=locs), ValueError, r"breaks page alignment")

    def _bad_past_context(self, s: Setup) -> Step | None:
        b = self._good_decode(s)
        if b is None:
            return None
        seq = b.seq_lens.copy()
        seq[-1] = self.context + 1
        return self._bad(
            "past_context",
            remade(b, seq_lens=seq),
            ValueError,
            rf"seq_len {self.context + 1} > max_context_len",
        )

    def _bad_row_range(self, s: Setup) -> Step | None:
        b = self._good_decode(s)
        if b is None:
            return None
        rows = b.req_pool_indices.copy()
        rows[-1] = self.max_reqs  # the dummy request row
        msg = rf"req_pool_indices: {self.max_reqs} not in \[0, {self.max_reqs}\)"
        return self._bad("row_range", remade(b, req_pool_indices=rows), ValueError, msg)

    def _bad_dummy_page(self, s: Setup) -> Step | None:
        b = self._good_decode(s)
        if b is None:
            return None
        locs = b.out_cache_loc.copy()
        locs[0] = s.kv.dummy_slot
        return self._bad("dummy_page", remade(b, out_cache_loc=locs), ValueError, r"page id out of range")

    def _bad_verify_token(self, s: Setup) -> Step | None:
        good = self.verify(s)
        if good is None or good.batch is None:
            return None
        ids = good.batch.input_ids.copy()
        ids[-1] = self.vocab + 3
        msg = rf"token id out of range in input_ids: {self.vocab + 3}"
        return self._bad("verify_token", remade(good.batch, input_ids=ids), ValueError, msg)

    def _bad_draft_extend_q(self, s: Setup) -> Step | None:
        n = self.spec.num_draft_tokens
        rows = self._live(room=n + 1)
        if not rows:
            return None
        r = self._pick(rows, 1)[0]
        b = self._writes(s, M.DRAFT_EXTEND, [r], [self.lens[r]], [n + 1])
        return self._bad("draft_extend_q", b, ValueError, rf"q_len {n + 1} > num_draft_tokens {n}")

    # ---- helpers ---------------------------------------------------------------------------
    def _bad(self, kind: str, batch: Batch, error: type[Exception], message: str) -> Step:
        return Step("bad:" + kind, batch, error=error, message=message)

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
