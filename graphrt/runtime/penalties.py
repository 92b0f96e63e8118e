"""Presence, frequency and repetition penalties: per request row, applied inside the graph.

Definitions (OpenAI's and vLLM's; ``z`` a row's raw logits, ``c_j`` how many times the request
has generated token ``j``, ``s_j`` whether ``j`` is in its prompt or output):

- ``presence_penalty`` ``p``: ``z_j -= p`` where ``c_j > 0``;
- ``frequency_penalty`` ``f``: ``z_j -= f * c_j``;
- ``repetition_penalty`` ``r`` (1: off): where ``s_j``, ``z_j / r`` if ``z_j > 0`` else ``z_j * r``.

Repetition is applied first, then frequency and presence (vLLM's order). The sampler (torch or
the Triton kernel) then draws from the penalised logits, so greedy and sampled rows alike are
penalised; log-probabilities stay those of the raw logits.

:class:`TokenCounts` keeps ``c`` and the prompt's tokens as device data, one row per
``req_to_token`` row (the dummy row included, where pad rows count). Every sampling step adds
each row's token, in place and inside the same graph as the draw (no host sync, fixed shapes),
whatever its mode. A request's row starts over in :meth:`TokenCounts.start`, which the engine
runs (stream-ordered, outside any graph) right before the step that samples the request's
first token, whether that step is a whole-prompt EXTEND or a MIXED step holding its last chunk:
``c`` is zeroed and the whole prompt marked (a prefix-cache hit's cached positions too, which
no step computes). What a prompt's earlier chunks drew and counted there (tokens that are
dropped) is wiped then, before any draw reads the row.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from graphrt.metadata.sampling import SamplingBuffers
from graphrt.step.limits import needs_vocab


class TokenCounts:
    """``counts [rows, V]`` int32 (output tokens per request row) and ``prompt [rows, V]`` bool."""

    def __init__(self, rows: int, vocab_size: int, device: torch.device) -> None:
        self.vocab = vocab_size
        self.counts = torch.zeros(rows, vocab_size, dtype=torch.int32, device=device)
        self.prompt = torch.zeros(rows, vocab_size, dtype=torch.bool, device=device)

    @classmethod
    def of(cls, wanted: bool, rows: int, vocab_size: int | None, device: torch.device) -> TokenCounts | None:
        """The counts of a runtime (``RuntimeConfig.penalties``: ``wanted``), or None."""
        return cls(rows, needs_vocab("penalties", vocab_size), device) if wanted else None

    def start(self, rows: Sequence[int], prompts: Sequence[Sequence[int]]) -> None:
        """Request rows ``rows [R]`` start over: no token counted, only ``prompts[r]`` (its
        whole prompt, token ids) marked. Host inputs; one pinned upload, stream-ordered after
        the steps launched and before the next (the host does not wait)."""
        if len(rows) == 0:
            return
        row = np.asarray(rows, dtype=np.int64)
        lens = np.fromiter((len(p) for p in prompts), dtype=np.int64, count=len(row))
        tokens = np.concatenate([np.asarray(p, dtype=np.int64) for p in prompts])
        if tokens.size and (tokens.min() < 0 or tokens.max() >= self.vocab):
            raise ValueError(
                f"prompt token ids must lie in [0, {self.vocab}), got {tokens.min()}..{tokens.max()}"
            )
        flat = np.repeat(row, lens) * self.vocab + tokens
        both = torch.from_numpy(np.concatenate([row, flat]))
        if self.counts.device.type == "cuda":
            both = both.pin_memory()  # NOTE: pinned: the copy does not wait for the steps in flight
        both = both.to(self.counts.device, non_blocking=True)
        index, marks = both[: row.size], both[row.size :]
        self.counts.index_fill_(0, index, 0)
        self.prompt.index_fill_(0, index, False)
        self.prompt.view(-1).index_fill_(0, marks, True)

    def apply(self, logits: torch.Tensor, rows: torch.Tensor, params: SamplingBuffers) -> torch.Tensor:
        """``logits [R, V]`` penalised for request rows ``rows [R]`` (a new float32 tensor)."""
        rows = rows.long()
        counts = self.counts.index_select(0, rows)
        seen = (counts > 0) | self.prompt.index_select(0, rows)
        z = logits.float()
        rep = params.repetition_penalty[:, None]
        z = torch.where(seen, torch.where(z > 0, z / rep, z * rep), z)
        z = z - params.frequency_penalty[:, None] * counts.float()
        return z - params.presence_penalty[:, None] * (counts > 0).float()

    def count(self, rows: torch.Tensor, tokens: torch.Tensor) -> None:
        """Add one to ``(rows[r], tokens[r])`` for every row (pad rows count in the dummy row)."""
        flat = rows.long() * self.vocab + tokens.long()
        self.counts.view(-1).index_add_(0, flat, torch.ones_like(flat, dtype=torch.int32))
