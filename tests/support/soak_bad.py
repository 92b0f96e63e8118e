"""The soak workload's bad batches: each one breaks exactly one rule (tests/support/soak.py proposes them)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from graphrt import Batch, ForwardMode
from graphrt.kv.ledger import KVIsolationError
from tests.support.util import Setup, remade, slot_of

if TYPE_CHECKING:
    from tests.support.soak import Step, Workload

M = ForwardMode


class BadSteps:
    """Bad batches for a :class:`~tests.support.soak.Workload`'s live rows."""

    def __init__(self, w: Workload) -> None:
        self.w = w

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
        for i in self.w.rng.permutation(len(makers)):
            made = makers[int(i)](s)
            if made is not None:
                return made
        return None

    def _good_decode(self, s: Setup, at_least: int = 1) -> Batch | None:
        rows = self.w._live(room=1)
        if len(rows) < at_least:
            return None
        rows = self.w._pick(rows, int(self.w.rng.integers(at_least, len(rows) + 1)))
        return self.w._writes(s, M.DECODE, rows, [self.w.lens[r] for r in rows], [1] * len(rows))

    def _bad_token(self, s: Setup) -> Step | None:
        b = self._good_decode(s)
        if b is None:
            return None
        ids = b.input_ids.copy()
        bad = int(self.w.rng.choice([self.w.vocab, self.w.vocab + 77, -1]))
        ids[int(self.w.rng.integers(0, ids.size))] = bad
        return self._bad(
            "token", remade(b, input_ids=ids), ValueError, rf"token id out of range.*{bad} not in"
        )

    def _bad_foreign_slot(self, s: Setup) -> Step | None:
        """Row ``r`` writes a page-aligned slot that live row ``o`` holds."""
        for r in self.w.rng.permutation(self.w._live(room=1)).tolist():
            pos = self.w.lens[r]
            for o in self.w.rng.permutation(sorted(self.w.lens)).tolist():
                # NOTE: positions of row o that share the page offset of r's next position.
                held = list(range(pos % self.w.page, self.w.lens[o], self.w.page))
                if o == r or not held:
                    continue
                slot = slot_of(s, o, held[int(self.w.rng.integers(0, len(held)))])
                b = Batch.create(
                    M.DECODE, input_ids=[1], seq_lens=[pos + 1], req_pool_indices=[r], out_cache_loc=[slot]
                )
                return self._bad(
                    "foreign_slot", b, KVIsolationError, rf"slot {slot} holds position \d+ of live row {o}"
                )
        return None

    def _bad_read_past_valid(self, s: Setup) -> Step | None:
        rows = self.w._live(room=3)
        if not rows:
            return None
        r = self.w._pick(rows, 1)[0]
        seq = int(self.w.rng.integers(self.w.lens[r] + 2, self.w.context + 1))
        b = self.w._writes(s, M.DECODE, [r], [seq - 1], [1])
        return self._bad(
            "read_past_valid", b, KVIsolationError, rf"\(row {r}\) reads KV positions 0\.\.{seq - 2}"
        )

    def _bad_freed_row(self, s: Setup) -> Step | None:
        free = [r for r in range(self.w.max_reqs) if r not in self.w.lens]
        if not free:
            return None
        r = self.w._pick(free, 1)[0]
        seq = int(self.w.rng.integers(2, self.w.context + 1))
        b = self.w._writes(s, M.DECODE, [r], [seq - 1], [1])
        return self._bad("freed_row", b, KVIsolationError, rf"\(row {r}\).*written only 0")

    def _bad_too_large(self, s: Setup) -> Step | None:
        bs = self.w.max_reqs + 1
        b = Batch.create(
            M.DECODE,
            input_ids=[1] * bs,
            seq_lens=[1] * bs,
            req_pool_indices=list(range(bs)),
            out_cache_loc=[slot_of(s, r, 0) for r in range(bs)],
        )
        return self._bad(
            "too_large", b, ValueError, rf"batch too large: bs {bs} > max_reqs {self.w.max_reqs}"
        )

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
        i = int(self.w.rng.integers(0, b.bs))
        locs = b.out_cache_loc.copy()
        locs[i] += 1 if locs[i] % self.w.page < self.w.page - 1 else -1
        return self._bad("misaligned", remade(b, out_cache_loc=locs), ValueError, r"breaks page alignment")

    def _bad_past_context(self, s: Setup) -> Step | None:
        b = self._good_decode(s)
        if b is None:
            return None
        seq = b.seq_lens.copy()
        seq[-1] = self.w.context + 1
        return self._bad(
            "past_context",
            remade(b, seq_lens=seq),
            ValueError,
            rf"seq_len {self.w.context + 1} > max_context_len",
        )

    def _bad_row_range(self, s: Setup) -> Step | None:
        b = self._good_decode(s)
        if b is None:
            return None
        rows = b.req_pool_indices.copy()
        rows[-1] = self.w.max_reqs  # the dummy request row
        msg = rf"req_pool_indices: {self.w.max_reqs} not in \[0, {self.w.max_reqs}\)"
        return self._bad("row_range", remade(b, req_pool_indices=rows), ValueError, msg)

    def _bad_dummy_page(self, s: Setup) -> Step | None:
        b = self._good_decode(s)
        if b is None:
            return None
        locs = b.out_cache_loc.copy()
        locs[0] = s.kv.dummy_slot
        return self._bad("dummy_page", remade(b, out_cache_loc=locs), ValueError, r"page id out of range")

    def _bad_verify_token(self, s: Setup) -> Step | None:
        good = self.w.verify(s)
        if good is None or good.batch is None:
            return None
        ids = good.batch.input_ids.copy()
        ids[-1] = self.w.vocab + 3
        msg = rf"token id out of range in input_ids: {self.w.vocab + 3}"
        return self._bad("verify_token", remade(good.batch, input_ids=ids), ValueError, msg)

    def _bad_draft_extend_q(self, s: Setup) -> Step | None:
        n = self.w.spec.num_draft_tokens
        rows = self.w._live(room=n + 1)
        if not rows:
            return None
        r = self.w._pick(rows, 1)[0]
        b = self.w._writes(s, M.DRAFT_EXTEND, [r], [self.w.lens[r]], [n + 1])
        return self._bad("draft_extend_q", b, ValueError, rf"q_len {n + 1} > num_draft_tokens {n}")

    def _bad(self, kind: str, batch: Batch, error: type[Exception], message: str) -> Step:
        from tests.support.soak import Step

        return Step("bad:" + kind, batch, error=error, message=message)
