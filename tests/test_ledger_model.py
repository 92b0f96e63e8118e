"""The KV ledger against a plain-Python model of page ownership, on random steps.

The model keeps, per row, the slot of each valid position, and judges a step by applying it
to a copy and checking the invariants attention relies on (issue 24.1): every position of a
row's logical page lies in one physical page, distinct logical pages of a row are distinct
pages, and a page a step writes is held by no other row, before or after it (a shared page is never
written); a
scratch write (tree draft) lands in no page another row holds, nor on a position its row
keeps. The ledger (vectorised, with its decode fast path and derived cursors) must accept
exactly the steps the model accepts and end in the model's state.
"""

from __future__ import annotations

import numpy as np
import pytest

from graphrt.kv.ledger import KVIsolationError, KVLedger, KVWrites

ROWS, CONTEXT = 4, 32


class Model:
    """Row -> list of slots of its valid positions; pages derived by ``slot // ps``."""

    def __init__(self, ps: int) -> None:
        self.ps, self.rows = ps, {r: [] for r in range(ROWS)}

    def holders(self, page: int) -> set[int]:
        return {r for r, slots in self.rows.items() if any(s // self.ps == page for s in slots)}

    def accepts(self, rows, starts, counts, slots, slot_req, recorded) -> bool:
        if any(s > len(self.rows[r]) for r, s in zip(rows, starts, strict=True)):
            return False
        after = {r: list(v) for r, v in self.rows.items()}
        for r, s in zip(rows, starts, strict=True):
            del after[r][s:]
        cut = {r: list(v) for r, v in after.items()}
        if recorded:
            for t, slot in enumerate(slots):
                after[rows[slot_req[t]]].append(slot)
        for t, slot in enumerate(slots):
            r, page = rows[slot_req[t]], slot // self.ps
            # NOTE: a page another row holds before the step (even one it drops in it) or after
            others = self.holders(page) | {
                h for h, v in after.items() if any(x // self.ps == page for x in v)
            }
            if others - {r}:
                return False
            if not recorded and any(
                x // self.ps == page and i % self.ps == slot % self.ps for i, x in enumerate(cut[r])
            ):
                return False  # NOTE: the slot of a position its row keeps
        return all(self._pages_ok(v) for v in after.values())

    def _pages_ok(self, slots: list[int]) -> bool:
        pages = [slots[j] // self.ps for j in range(0, len(slots), self.ps)]
        same = all(s // self.ps == pages[i // self.ps] for i, s in enumerate(slots))
        return same and len(set(pages)) == len(pages)

    def apply(self, rows, starts, counts, slots, slot_req, recorded) -> None:
        for r, s in zip(rows, starts, strict=True):
            del self.rows[r][s:]
        if recorded:
            for t, slot in enumerate(slots):
                self.rows[rows[slot_req[t]]].append(slot)


def random_step(rng: np.random.Generator, model: Model, pages: list[list[int]]) -> tuple:
    """A step of 1-3 rows: mostly honest slots (each row's own pages), sometimes another
    row's page, a free page, or a split page; DECODE-like (per row) or multi-token."""
    ps = model.ps
    rows = [int(r) for r in rng.choice(ROWS, int(rng.integers(1, 4)), replace=False)]
    one = rng.random() < 0.5
    starts, counts, slots, slot_req = [], [], [], []
    for i, r in enumerate(rows):
        have = len(model.rows[r])
        start = min(have if rng.random() < 0.6 else int(rng.integers(0, have + 2)), CONTEXT - 1)
        n = 1 if one else int(rng.integers(1, 2 * ps + 2))
        n = max(1, min(n, CONTEXT - start))
        for p in range(start, start + n):
            page = pages[r][p // ps]
            roll = rng.random()
            if roll < 0.08:
                page = int(rng.integers(0, ROWS * CONTEXT // ps))
            elif roll < 0.12:
                page = pages[int(rng.integers(0, ROWS))][p // ps]
            slots.append(page * ps + p % ps)
            slot_req.append(i)
        starts.append(start)
        counts.append(n)
    return rows, starts, counts, slots, slot_req, one


def writes(rows, starts, counts, slots, slot_req, one, recorded) -> KVWrites:
    a = np.asarray
    pos = [starts[i] + k for i, n in enumerate(counts) for k in range(n)]
    per_row = one and recorded
    kept = a(counts) if recorded else np.zeros(len(rows), dtype=np.int64)
    return KVWrites(a(rows), a(starts), kept, a(slots), a(slot_req), a(pos), recorded, per_row)


def assert_same(ledger: KVLedger, model: Model) -> None:
    for r, slots in model.rows.items():
        assert int(ledger.valid_lens[r]) == len(slots)
        assert ledger.table[r, : len(slots)].tolist() == slots
    refs = [len(model.holders(p)) for p in range(ledger.refs.size)]
    assert ledger.refs.tolist() == refs
    # NOTE: the derived state equals what it is derived from
    ps, end = model.ps, ROWS * CONTEXT
    key = [end if s % ps == 0 and not refs[s // ps] else (-1 if s % ps == 0 else s) for s in range(end)]
    assert ledger.key.tolist() == key
    if ps == 1:
        return  # NOTE: the cursor is not kept: every position opens a page
    for r, slots in model.rows.items():
        shared = bool(slots) and refs[slots[-1] // ps] > 1
        want = end if len(slots) % ps == 0 else (-2 if shared else slots[-1] + 1)
        assert int(ledger.cursor[r]) == want, (r, slots)


@pytest.mark.parametrize("ps", [1, 4])
def test_ledger_accepts_exactly_what_the_model_accepts(ps: int) -> None:
    rng = np.random.default_rng(ps)
    ledger, model = KVLedger(ROWS, CONTEXT, ROWS * CONTEXT, ps), Model(ps)
    per = CONTEXT // ps
    order = rng.permutation(ROWS * per)  # NOTE: each row's own pages, scattered
    pages = [order[r * per : (r + 1) * per].tolist() for r in range(ROWS)]
    seen = {"accepted": 0, "refused": 0, "shared": 0}
    for _ in range(1500):
        roll = rng.random()
        if roll < 0.04:
            r = int(rng.integers(0, ROWS))
            ledger.free(r)
            model.rows[r] = []
            continue
        if roll < 0.08:
            r = int(rng.integers(0, ROWS))
            keep = int(rng.integers(0, len(model.rows[r]) + 1))
            ledger.truncate(np.array([r]), np.array([keep]))  # NOTE: a failed step's undo
            del model.rows[r][keep:]
            assert_same(ledger, model)
            continue
        if roll < 0.12:
            src, dst = (int(x) for x in rng.choice(ROWS, 2, replace=False))
            n = int(rng.integers(0, len(model.rows[src]) + 1))
            if n % ps:
                with pytest.raises(KVIsolationError, match="not a multiple of page_size"):
                    ledger.share_prefix(src, dst, n)
            else:
                ledger.share_prefix(src, dst, n)
                model.rows[dst] = model.rows[src][:n]
                seen["shared"] += 1
            assert_same(ledger, model)
            continue
        step = random_step(rng, model, pages)
        if len(set(step[3])) != len(step[3]):
            continue  # NOTE: Batch.check refuses repeated slots before the ledger sees them
        recorded = rng.random() < 0.85
        w = writes(*step, recorded)
        want = model.accepts(list(w.rows), list(w.starts), list(w.counts), step[3], step[4], recorded)
        try:
            ledger.check(w)
        except KVIsolationError:
            assert not want, f"refused a step the model accepts: {w}"
            seen["refused"] += 1
            continue
        assert want, f"accepted a step the model refuses: {w}"
        ledger.commit(w)
        model.apply(list(w.rows), list(w.starts), list(w.counts), step[3], step[4], recorded)
        seen["accepted"] += 1
        assert_same(ledger, model)
    assert min(seen.values()) > 20, seen
