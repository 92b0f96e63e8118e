"""Host cost of KV isolation per DECODE step: ``KVWrites.of`` + ``KVLedger.check`` + ``commit``.

``python -m tests.support.bench_ledger`` prints p50/p90 µs per batch size on this machine. Every row
holds ``REAL`` positions and each timed step writes the next one (the decode steady state);
the batches are built before timing, as ``graphrt bench host`` does for ``validate``.
``rewrite``: each step writes the same position again (a verify rewriting its rejected
drafts), which also drops the row's tail and releases its slot.
"""

from __future__ import annotations

import time

import numpy as np

from graphrt import Batch, ForwardMode
from graphrt.kv.ledger import KVLedger, KVWrites

CONTEXT, REAL, STEPS = 4096, 512, 2000


def decode(bs: int, seq_len: int) -> Batch:
    """Row ``r`` (slots ``r * CONTEXT ...``) writes position ``seq_len - 1``."""
    rows = np.arange(bs)
    return Batch.create(
        ForwardMode.DECODE,
        input_ids=np.zeros(bs, dtype=np.int64),
        seq_lens=np.full(bs, seq_len),
        req_pool_indices=rows,
        out_cache_loc=rows * CONTEXT + seq_len - 1,
    )


def measure(bs: int, rewrite: bool = False) -> tuple[float, float]:
    """(p50, p90) µs of one step's isolation check and commit at batch size ``bs``."""
    ledger = KVLedger(bs, CONTEXT, bs * CONTEXT)
    prefill = Batch.create(
        ForwardMode.EXTEND,
        input_ids=np.zeros(bs * REAL, dtype=np.int64),
        seq_lens=np.full(bs, REAL),
        req_pool_indices=np.arange(bs),
        out_cache_loc=(np.arange(bs)[:, None] * CONTEXT + np.arange(REAL)).ravel(),
        q_lens=np.full(bs, REAL),
    )
    ledger.commit(KVWrites.of(prefill))
    batches = [decode(bs, REAL + 1 + (0 if rewrite else i)) for i in range(STEPS)]
    times = np.empty(STEPS)
    for i, batch in enumerate(batches):
        start = time.perf_counter()
        writes = KVWrites.of(batch)
        ledger.check(writes)
        ledger.commit(writes)
        times[i] = (time.perf_counter() - start) * 1e6
    warm = times[STEPS // 10 :]
    return float(np.percentile(warm, 50)), float(np.percentile(warm, 90))


if __name__ == "__main__":
    for rewrite in (False, True):
        for bs in (1, 8, 64, 256):
            p50, p90 = measure(bs, rewrite)
            what = "rewrite" if rewrite else "append "
            print(f"{what} bs {bs:4d}: isolation check + commit p50 {p50:5.1f} µs, p90 {p90:5.1f} µs")
