"""Token ids that stay on the device: each request row's last sampled token feeds its next step.

An overlapped engine launches step N+1 before it has read step N's tokens. So the step's input
ids do not come from the host: :class:`TokenFeed` keeps ``last[row]``, the token each request row
(``req_to_token`` row) sampled last, in a device buffer. A step run with a :class:`StepFeed`
(``GraphRuntime.run(batch, feed=...)``) first gathers its input ids from that buffer into the
static ``input_ids`` (after the host upload, before the replay), then writes its own sampled
tokens back. Indexing by request row maps step N's rows to step N+1's rows whatever joined or
left in between: a newly admitted request's row holds the token its prefill sampled.

Both are stream-ordered device ops (no host sync), outside the captured graph, so every graph
is the one captured without a feed. Gathered ids come from the model's own sampler (an argmax
or an in-graph draw over the vocabulary), so they are in range by construction; the host check
of ``Batch.input_ids`` (``Batch.check``) still runs on what the host gave (placeholders here).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from graphrt.metadata.base import StepBuffers


class TokenFeed:
    """``last [rows]`` int64 on ``device``: the last token each request row sampled.

    ``rows`` is ``req_to_token``'s rows including the dummy request: pad rows of a bucket
    gather the dummy entry, which nothing writes, so they read token 0 (their pad value).
    """

    def __init__(self, rows: int, device: torch.device) -> None:
        self.last = torch.zeros(rows, dtype=torch.int64, device=device)
        self.prefill = StepFeed(self, gather=False)  # prompt ids from the host; record only
        self.decode = StepFeed(self, gather=True)


@dataclass(frozen=True, slots=True)
class StepFeed:
    """What a step does with a :class:`TokenFeed`: ``gather`` its input ids (one token per
    request: DECODE), and always record the tokens it sampled."""

    tokens: TokenFeed
    gather: bool

    def before(self, step: StepBuffers, bs: int) -> None:
        """``input_ids[r] = last[req_pool_indices[r]]`` for the step's ``bs`` real rows."""
        if self.gather and bs:
            rows = step.req_pool_indices[:bs]
            torch.index_select(self.tokens.last, 0, rows, out=step.input_ids[:bs])

    def after(self, step: StepBuffers, bs: int, sampled: torch.Tensor) -> None:
        """``last[req_pool_indices[r]] = sampled[r]``; ``sampled [bs]`` int64 (one per request).

        Reads ``req_pool_indices`` before the next step's upload overwrites it (stream order).
        """
        if bs:
            self.tokens.last.index_copy_(0, step.req_pool_indices[:bs], sampled[:bs])
