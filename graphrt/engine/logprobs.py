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

from graphrt.runtime.logprobs import TokenLogprobs, step_logprobs, unpack

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
    rows: list[TokenLogprobs] | None = None
    for i, r in enumerate(reqs):
        ask = r.sampling.logprobs if r.sampling is not None else None
        if ask is None or len(r.logprobs) >= len(r.output):
            continue
        rows = rows if rows is not None else unpack(tokens, packed)
        row = rows[i]
        r.logprobs.append(TokenLogprobs(row.token, row.logprob, row.top_ids[:ask], row.top_logprobs[:ask]))
