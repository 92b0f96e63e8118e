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
``req_to_token`` row (the dummy row included, where pad rows count): an EXTEND step resets its
requests' rows and marks their prompts, and every sampling step adds its tokens, in place and
inside the same graph as the draw (no host sync, fixed shapes).
"""

from __future__ import annotations

import torch

from graphrt.metadata.sampling import SamplingBuffers


class TokenCounts:
    """``counts [rows, V]`` int32 (output tokens per request row) and ``prompt [rows, V]`` bool."""

    def __init__(self, rows: int, vocab_size: int, device: torch.device) -> None:
        self.vocab = vocab_size
        self.counts = torch.zeros(rows, vocab_size, dtype=torch.int32, device=device)
        self.prompt = torch.zeros(rows, vocab_size, dtype=torch.bool, device=device)

    @classmethod
    def of(cls, wanted: bool, rows: int, vocab_size: int | None, device: torch.device) -> TokenCounts | None:
        """The counts of a runtime (``RuntimeConfig.penalties``: ``wanted``), or None."""
        if not wanted:
            return None
        if vocab_size is None:
            raise ValueError("penalties=True needs the model's vocab_size (pass vocab_size=)")
        return cls(rows, vocab_size, device)

    def start(self, input_ids: torch.Tensor, cu_seqlens_q: torch.Tensor, rows: torch.Tensor) -> None:
        """A prefill: request rows ``rows [R]`` start over, their prompts ``input_ids [T]``
        (request ``r`` holds tokens ``cu_seqlens_q[r]:cu_seqlens_q[r + 1]``) marked."""
        rows = rows.long()
        self.counts.index_fill_(0, rows, 0)
        self.prompt.index_fill_(0, rows, False)
        t = torch.arange(input_ids.shape[0], device=input_ids.device)
        owner = torch.searchsorted(cu_seqlens_q[1:].long(), t, right=True).clamp_(max=rows.shape[0] - 1)
        flat = rows[owner] * self.vocab + input_ids.long()
        self.prompt.view(-1).index_fill_(0, flat, True)

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
