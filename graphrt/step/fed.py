"""Which input ids a fed step may hold: placeholders the device resolves, and token ids.

A fed DECODE gives :data:`FED` for every request (the device gathers each row's last token).
A fed TARGET_VERIFY (an overlapped speculative round) gives :data:`FED` for each request's
node 0 (its pending token, gathered on the device) and, for its draft nodes, token ids or
:data:`PAD_DRAFT`: a node with nothing proposed, which the device feeds the pending token and
whose acceptance is always 0 (no draw is negative).
"""

from __future__ import annotations

import numpy as np

from graphrt.step.hostops import any_true, umax, umin
from graphrt.step.modes import ForwardMode

#: The input id of a fed row: its token is gathered on the device (:mod:`graphrt.runtime.feed`).
FED = -1
#: A fed verify's draft node that carries no proposal (never accepted).
PAD_DRAFT = -2


def fed_verify_ok(ids: np.ndarray, bs: int, vocab: int) -> bool:
    """True when ``ids`` are valid fed verify ids (:func:`fed_ids_error` would return None), in
    a few reductions; False: let :func:`fed_ids_error` say why (or, rarely, accept them)."""
    nodes = ids.reshape(bs, -1)
    heads, drafts = nodes[:, 0], nodes[:, 1:]
    if not umin(heads) == FED == umax(heads):
        return False
    if not drafts.size:
        return True
    lo = umin(drafts)
    if lo < PAD_DRAFT or umax(drafts) >= vocab:
        return False
    # NOTE: ids lie in [PAD_DRAFT, vocab): only FED, between PAD_DRAFT and 0, may not be a draft
    return lo >= 0 or not any_true((drafts == FED).reshape(-1))


def fed_ids_error(mode: ForwardMode, ids: np.ndarray, bs: int, vocab: int) -> str | None:
    """Why ``ids [num_tokens]`` cannot be a fed step's input ids, or None when they can.

    ``bs``: the step's requests (a verify's ids are ``[bs, nodes]`` request-major);
    ``vocab``: the bound of a draft's token id.
    """
    if mode is not ForwardMode.TARGET_VERIFY:
        if (ids == FED).all():
            return None
        i = int(np.argmax(ids != FED))
        return f"a fed step's input ids must all be FED ({FED}), got {int(ids[i])} at input_ids[{i}]"
    nodes = ids.reshape(bs, -1)
    heads, drafts = nodes[:, 0], nodes[:, 1:]
    if (heads != FED).any():
        i = int(np.argmax(heads != FED))
        return f"a fed verify's node 0 must be FED ({FED}), got {int(heads[i])} in request {i}"
    bad = (drafts != PAD_DRAFT) & ((drafts < 0) | (drafts >= vocab))
    if bad.any():
        i, j = (int(v) for v in np.argwhere(bad)[0])
        return (
            f"a fed verify's draft must be PAD_DRAFT ({PAD_DRAFT}) or a token id in [0, {vocab}), "
            f"got {int(drafts[i, j])} at node {j + 1} of request {i}"
        )
    return None
