"""Each generated token's log-probabilities, kept on the request that asked for them.

The runtime computes them inside the sampling step (``RuntimeConfig.logprobs``;
:mod:`graphrt.runtime.logprobs`); an engine that samples on the host (``record_logits``)
computes the same from the logits it holds. Either way :func:`attach` appends one
:class:`~graphrt.runtime.logprobs.TokenLogprobs` per token a request kept, cut to the number
of top entries it asked for (``SamplingParams.logprobs``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import torch

from graphrt.runtime.logprobs import TokenLogprobs, step_logprobs

if TYPE_CHECKING:
    from graphrt.engine.request import Request


def wants(reqs: Sequence[Request]) -> bool:
    """Whether any of ``reqs`` asked for log-probabilities."""
    return any(r.sampling is not None and r.sampling.logprobs is not None for r in reqs)


def host_packed(logits: torch.Tensor, tokens: Sequence[int], k: int) -> torch.Tensor:
    """:func:`step_logprobs` of ``logits [R, V]`` held outside the graph (``k`` >= 1)."""
    ids = torch.as_tensor(list(tokens), dtype=torch.int64, device=logits.device)
    return step_logprobs(logits, ids, k)


def attach(reqs: Sequence[Request], tokens: np.ndarray, packed: np.ndarray | None) -> None:
    """Give each request of ``reqs`` that asked the log-probabilities of its new token.

    ``tokens [R]`` and ``packed [R, 1 + 2K]`` (:func:`step_logprobs`'s rows, on the host) are
    the step's, in ``reqs``' order; a request whose output did not grow (an overlapped step's
    extra token, dropped) gets nothing.
    """
    if packed is None:
        return
    asking = [(i, r, ask) for i, r in enumerate(reqs) if (ask := _asked(r)) is not None]
    if not asking:
        return
    # NOTE: one conversion per column block for every asking row, cut to the most top entries
    # any of them asked (the engine computes K for all); then one object per row
    k, top = (packed.shape[1] - 1) // 2, max(ask for _, _, ask in asking)
    rows = [i for i, _, _ in asking]
    picked = packed if len(rows) == len(packed) else packed[rows]
    chosen = picked[:, 0].tolist()
    values = picked[:, 1 : 1 + top].tolist()
    ids = picked[:, 1 + k : 1 + k + top].astype(np.int64).tolist()
    toks = (tokens if len(rows) == len(tokens) else tokens[rows]).tolist()
    for (_, r, ask), t, c, i, v in zip(asking, toks, chosen, ids, values, strict=True):
        if ask != top:
            i, v = i[:ask], v[:ask]
        r.logprobs.append(TokenLogprobs(t, c, tuple(i), tuple(v)))


def _asked(r: Request) -> int | None:
    """The top entries ``r`` asked for if it asked for log-probabilities and its output grew
    past them, else None."""
    ask = r.sampling.logprobs if r.sampling is not None else None
    return ask if ask is not None and len(r.logprobs) < len(r.output) else None
