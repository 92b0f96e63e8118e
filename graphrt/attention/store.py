"""Where a layer's new keys get rotated and stored: by the backend's attention kernel, or before it.

A layer that hands the context its q and k unrotated (``rope=``) has them rotated and k, v stored
by :func:`~graphrt.kv.rope_store.rope_store` before the backend attends, unless the backend
``fuses_store`` the call (the split decode kernel's decode steps): then the call carries the new
keys (:class:`~graphrt.attention.call.FreshKV`) and the unrotated q, and its kernel does both.
"""

from __future__ import annotations

import dataclasses

from graphrt.attention.base import AttentionBackend
from graphrt.attention.call import AttendCall, FreshKV
from graphrt.kv.rope_store import rope_store


def rotate_and_store(
    backend: AttentionBackend, call: AttendCall, fresh: FreshKV, *, own_rows: bool = True
) -> AttendCall:
    """``call`` for ``backend`` once ``fresh`` is seen to: carrying ``fresh`` (and ``call.q``
    unrotated) where the backend ``fuses_store``, else with ``q`` rotated by ``rope_store``,
    which has stored ``fresh`` (FP8 caches quantised with ``call.kv_scales``).

    ``own_rows``: each row of ``call.meta`` is its request's only new token, so no row reads a
    key another row of the launch stores. False for a chunked-local virtual batch (one row per
    query token): sibling tokens of a request read each other's new keys, which must all be
    stored before any row attends, so the store is never fused there.
    """
    fused = dataclasses.replace(call, fresh=fresh)
    if own_rows and backend.fuses_store(fused):
        return fused
    k, v, cos_sin, loc = fresh.k, fresh.v, fresh.cos_sin, fresh.loc
    q = rope_store(call.q, k, v, cos_sin, call.k_cache, call.v_cache, loc, call.kv_scales)
    return dataclasses.replace(call, q=q)
