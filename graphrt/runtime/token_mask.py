"""Allowed-token bitmasks (constrained decoding), applied inside the sampling step.

A grammar library (xgrammar) gives, for a request whose output must follow a grammar, the
tokens it may sample next as a bitmask: int32 words, bit ``j % 32`` of word ``j // 32`` set when
token ``j`` is allowed. :class:`TokenMasks` keeps one such mask per ``req_to_token`` row on the
device (every bit set: no constraint); the engine writes a constrained request's row before
each step that samples for it, and the sampling step sets the logits of disallowed tokens to
``-inf`` before the draw (greedy and sampled alike). Log-probabilities stay the raw logits'.
"""

from __future__ import annotations

import numpy as np
import torch

#: Every token allowed.
ALL = -1


class TokenMasks:
    """``masks [rows, ceil(V / 32)]`` int32 on ``device``, every row all-allowed at first."""

    def __init__(self, rows: int, vocab_size: int, device: torch.device) -> None:
        self.vocab = vocab_size
        self.words = (vocab_size + 31) // 32
        self.masks = torch.full((rows, self.words), ALL, dtype=torch.int32, device=device)
        self._shifts = torch.arange(32, dtype=torch.int32, device=device)

    @classmethod
    def of(cls, wanted: bool, rows: int, vocab_size: int | None, device: torch.device) -> TokenMasks | None:
        """The masks of a runtime (``RuntimeConfig.token_masks``: ``wanted``), or None."""
        if not wanted:
            return None
        if vocab_size is None:
            raise ValueError("token_masks=True needs the model's vocab_size (pass vocab_size=)")
        return cls(rows, vocab_size, device)

    def write(self, rows: np.ndarray, masks: np.ndarray) -> None:
        """Rows ``rows [n]`` take ``masks [n, words]`` int32 (host), stream-ordered before the
        next step reads them."""
        if len(rows) == 0:
            return
        src = torch.from_numpy(np.ascontiguousarray(masks, dtype=np.int32)).to(self.masks.device)
        index = torch.from_numpy(np.asarray(rows, dtype=np.int64)).to(self.masks.device)
        self.masks.index_copy_(0, index, src)

    def apply(self, logits: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """``logits [R, V]`` with the tokens request rows ``rows [R]`` may not take at ``-inf``."""
        words = self.masks.index_select(0, rows.long())
        bits = (words[:, :, None] >> self._shifts) & 1
        allowed = bits.reshape(words.shape[0], -1)[:, : logits.shape[-1]].bool()
        return logits.float().masked_fill(~allowed, -torch.inf)
