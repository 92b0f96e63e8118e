"""Log-probabilities of a sampling step, computed in the same graph as the draw.

A runtime built with ``RuntimeConfig(logprobs=K)`` ends every sampling step with one more
output beside the tokens: per request row the chosen token's log-probability and the ``K`` best
tokens' (ids and log-probabilities), from ``log_softmax`` of the row's *raw* logits (before
temperature and filters: what vLLM reports by default). The three are packed into one float32
tensor ``[R, 1 + 2K]`` (ids are exact in float32: the sampler's vocabulary is below 2**21), so
one static buffer per bucket holds them and one copy brings them to the host.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


def step_logprobs(logits: torch.Tensor, tokens: torch.Tensor, k: int) -> torch.Tensor:
    """Packed log-probabilities ``[R, 1 + 2k]`` float32 of ``tokens [R]`` int64 under ``logits [R, V]``.

    Column 0: the chosen token's; columns ``1..k``: the ``k`` best (descending; equal values:
    the lower id first); columns ``k+1..2k``: their ids. Graph-safe: no host sync, fixed shapes.
    """
    lp = torch.log_softmax(logits.float(), dim=-1)
    chosen = lp.gather(1, tokens[:, None])
    best, ids = lp.topk(k, dim=-1, sorted=True)
    return torch.cat((chosen, best, ids.float()), dim=1)


@dataclass(slots=True)
class TokenLogprobs:
    """One generated token's log-probability and the ``k`` best of its step (ids, values).

    NOTE: not frozen, though never modified: one is made per token of every asking row on the
    engine thread, and a frozen dataclass's ``__init__`` (a ``object.__setattr__`` per field)
    costs about twice a plain one's.
    """

    token: int
    logprob: float
    top_ids: tuple[int, ...]
    top_logprobs: tuple[float, ...]
