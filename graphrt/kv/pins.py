"""Prefix-cache pins in the KV ledger: cached pages outlive their rows, read-only, shared.

A prefix cache keeps full pages of KV after the request that wrote them is gone. Each cached
slot holds one extra reference in :class:`~graphrt.kv.ledger.KVLedger` (``refs``) and is
marked ``pinned``, so:

- no step may write it (the ledger's slot check sees a holder other than the writing row);
- a row that *adopts* a cached prefix holds positions ``0 .. n-1`` exactly as the cache
  recorded them (slot ``i`` of the prefix holds position ``i``), nothing past them;
- unpinning (eviction) is refused while any row still holds the slot.

Every check raises :class:`~graphrt.kv.ledger.KVIsolationError` before anything changes.
"""

from __future__ import annotations

import numpy as np

from graphrt.kv.ledger import KVIsolationError, KVLedger


def pin(ledger: KVLedger, slots: np.ndarray, positions: np.ndarray) -> None:
    """The cache takes a reference to ``slots`` (int64 ``[n]``), which hold ``positions``.

    Refused when a slot is already pinned, holds no live KV, or holds another position: the
    cache can only keep KV that a row has written.
    """
    bad = ledger.pinned[slots] | (ledger.refs[slots] < 1) | (ledger.slot_pos[slots] != positions)
    if bad.any():
        i = int(np.argmax(bad))
        slot, have = int(slots[i]), int(ledger.slot_pos[slots[i]])
        why = (
            "is pinned already"
            if ledger.pinned[slot]
            else "holds no live KV"
            if ledger.refs[slot] < 1
            else f"holds position {have}"
        )
        raise KVIsolationError(f"pin: slot {slot} (position {int(positions[i])}) {why}")
    ledger.refs[slots] += 1
    ledger.pinned[slots] = True


def unpin(ledger: KVLedger, slots: np.ndarray) -> None:
    """The cache drops its reference to ``slots`` (an evicted page): they become free.

    Refused (nothing changed) when a slot is not pinned, or a live row still holds it: a page
    in use is never evicted.
    """
    not_pinned = ~ledger.pinned[slots]
    in_use = ledger.refs[slots] > 1
    bad = not_pinned | in_use
    if bad.any():
        i = int(np.argmax(bad))
        slot = int(slots[i])
        why = "is not pinned" if not_pinned[i] else f"is held by live row {ledger.holder(slot)}"
        raise KVIsolationError(f"unpin: slot {slot} {why}: a page in use is never evicted")
    ledger.refs[slots] = 0
    ledger.pinned[slots] = False
    ledger.owner[slots] = -1


def adopt(ledger: KVLedger, row: int, slots: np.ndarray) -> None:
    """Row ``row`` (freed first) holds the cached ``slots`` as its positions ``0 .. n-1``.

    Refused (nothing changed) unless every slot is pinned and holds exactly its position: a
    row never reads KV past the prefix the cache holds for it.
    """
    n = slots.size
    if n % ledger.page_size:
        raise KVIsolationError(
            f"adopt: {n} position(s) is not a multiple of page_size {ledger.page_size}: "
            "cached prefixes are whole pages"
        )
    positions = np.arange(n, dtype=np.int64)
    bad = ~ledger.pinned[slots] | (ledger.slot_pos[slots] != positions)
    if bad.any():
        i = int(np.argmax(bad))
        slot = int(slots[i])
        why = (
            "is not a cached page's"
            if not ledger.pinned[slot]
            else f"holds position {int(ledger.slot_pos[slot])}"
        )
        raise KVIsolationError(
            f"adopt: row {row} would read position {i} from slot {slot}, which {why} "
            f"(limit: the cached prefix holds positions < {i})"
        )
    ledger.free(row)
    ledger.table[row, :n] = slots
    ledger.refs[slots] += 1
    ledger.valid_lens[row] = n
