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


def rotate_and_store(backend: AttentionBackend, call: AttendCall, fresh: FreshKV) -> AttendCall:
    """``call`` for ``backend`` once ``fresh`` is seen to: carrying ``fresh`` (and ``call.q``
    unrotated) where the backend ``fuses_store``, else with ``q`` rotated by ``rope_store``,
    which has stored ``fresh`` (FP8 caches quantised with ``call.kv_scales``)."""
    fused = dataclasses.replace(call, fresh=fresh)
    if backend.fuses_store(fused):
        return fused
    k, v, cos_sin, loc = fresh.k, fresh.v, fresh.cos_sin, fresh.loc
    q = rope_store(call.q, k, v, cos_sin, call.k_cache, call.v_cache, loc, call.kv_scales)
    return dataclasses.replace(call, q=q)
