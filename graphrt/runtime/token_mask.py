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

from graphrt.buffers.stream import current_stream
from graphrt.step.limits import needs_vocab

#: Every token allowed.
ALL = -1


class TokenMasks:
    """``masks [rows, ceil(V / 32)]`` int32 on ``device``, every row all-allowed at first.

    A write fills host rows (:meth:`staging`: ``[rows, words]`` int32, pinned on CUDA, so a
    grammar library fills them in place) and :meth:`upload` moves the first ``n`` of them to
    their request rows: a non-blocking copy (two when the rows changed) and one ``index_copy_``,
    stream-ordered before the next step, allocating nothing.
    """

    def __init__(self, rows: int, vocab_size: int, device: torch.device) -> None:
        self.vocab = vocab_size
        self.words = (vocab_size + 31) // 32
        self.masks = torch.full((rows, self.words), ALL, dtype=torch.int32, device=device)
        self._shifts = torch.arange(32, dtype=torch.int32, device=device)
        pin = device.type == "cuda"
        self._host = torch.full((rows, self.words), ALL, dtype=torch.int32, pin_memory=pin)
        self._host_np = self._host.numpy()
        self._index = torch.zeros(rows, dtype=torch.int64, pin_memory=pin)
        self._index_np = self._index.numpy()
        # NOTE: device copies of the staged rows: index_copy_ then reads device tensors only
        self._dev = torch.empty_like(self.masks), torch.zeros_like(self._index, device=device)
        self._copied = torch.cuda.Event() if pin else None  # NOTE: the host rows' last copy
        self._pending = False
        self._views: dict[int, tuple[torch.Tensor, ...]] = {}
        #: Rows whose mask is a grammar's (host; :meth:`upload`'s ``grammar``): a step none of
        #: whose rows is may skip the masks (:mod:`graphrt.runtime.lean`).
        self.grammar = np.zeros(rows, dtype=bool)

    @classmethod
    def of(cls, wanted: bool, rows: int, vocab_size: int | None, device: torch.device) -> TokenMasks | None:
        """The masks of a runtime (``RuntimeConfig.token_masks``: ``wanted``), or None."""
        return cls(rows, needs_vocab("token_masks", vocab_size), device) if wanted else None

    def staging(self) -> tuple[torch.Tensor, np.ndarray]:
        """The host rows the next :meth:`upload` copies, ``[rows, words]`` int32, as a tensor
        and its numpy view (the same memory), free to write: waits for the last upload's copy
        only (done already once a step after it was read)."""
        if self._pending:
            assert self._copied is not None
            self._copied.synchronize()
            self._pending = False
        return self._host, self._host_np

    def upload(self, rows: np.ndarray, grammar: np.ndarray | bool = True) -> None:
        """Request rows ``rows [n]`` take the first ``n`` staged rows (:meth:`staging`);
        ``grammar`` (``[n]`` bool, or one for all): whether each is a grammar's mask (else all
        tokens allowed)."""
        n = len(rows)
        if n == 0:
            return
        if n > len(self._index_np):
            raise ValueError(f"{n} mask rows written at once; the masks hold {len(self._index_np)}")
        self.grammar[rows] = grammar
        views = self._views.get(n)
        if views is None:  # NOTE: slices made once per count (a tensor slice costs per step)
            views = self._views[n] = (self._host[:n], self._index[:n], self._dev[0][:n], self._dev[1][:n])
        host, index, dev, dev_index = views
        dev.copy_(host, non_blocking=True)
        if not np.array_equal(self._index_np[:n], rows):
            # NOTE: the device index always equals the host one (each write is copied at once),
            # and the decode steady state writes the same rows each step: no copy then
            self._index_np[:n] = rows
            dev_index.copy_(index, non_blocking=True)
        self.masks.index_copy_(0, dev_index, dev)
        if self._copied is not None:
            self._copied.record(current_stream(self.masks.device))
            self._pending = True

    def apply(self, logits: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """``logits [R, V]`` with the tokens request rows ``rows [R]`` may not take at ``-inf``."""
        words = self.masks.index_select(0, rows.long())
        bits = (words[:, :, None] >> self._shifts) & 1
        allowed = bits.reshape(words.shape[0], -1)[:, : logits.shape[-1]].bool()
        return logits.float().masked_fill(~allowed, -torch.inf)
