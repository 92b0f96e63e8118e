"""The encoder KV cache of an encoder-decoder model: each request's cross-attention keys and values.

An encoder-decoder model runs its encoder once per request; every cross-attention layer
projects the encoder's output to K and V, written once into this cache (SGLang's
``encoder_out_cache_loc``) and read by every later step of the request, non-causally.

The cache has its own pages (a :class:`PagedKVCache` of the cross layers, its last page the
dummy page) and a per-request-row table on the device: ``pages [max_reqs + 1, max_pages]``
int32 (the row's encoder pages, then the dummy page) and ``lens [max_reqs + 1]`` int32 (its
encoder length). Request row ``r`` owns pages ``r * max_pages … (r + 1) * max_pages - 1``: an
encoder output never grows, so a fixed share per row needs no allocator. Row ``max_reqs`` is the
dummy request's (dummy page, length 1), which pad rows of a step read. A host mirror of the
lengths (0: no encoder output yet) lets a step be refused before anything is written.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from graphrt.kv.paged import PagedKVCache


class EncoderKV:
    """Cross-attention K/V per request row, in ``kv`` (one cache layer per cross layer).

    ``kv`` must hold ``max_reqs * ceil(max_len / page_size)`` pages plus its dummy page.
    """

    def __init__(self, kv: PagedKVCache, max_reqs: int, max_len: int) -> None:
        if max_len < 1:
            raise ValueError(f"max encoder length must be >= 1, got {max_len}")
        self.kv, self.max_reqs, self.max_len = kv, max_reqs, max_len
        self.max_pages = -(-max_len // kv.page_size)
        need = max_reqs * self.max_pages + 1
        if kv.shape.num_pages < need:
            raise ValueError(
                f"encoder KV cache has {kv.shape.num_pages} pages; {max_reqs} rows of "
                f"{self.max_pages} pages plus the dummy need {need}"
            )
        dev = kv.device
        self.pages = torch.full((max_reqs + 1, self.max_pages), kv.dummy_page, dtype=torch.int32, device=dev)
        self.lens = torch.ones(max_reqs + 1, dtype=torch.int32, device=dev)
        #: Host: encoder length each row holds (0: none since it was freed or created).
        self.host_lens = np.zeros(max_reqs, dtype=np.int64)

    @property
    def dummy_req(self) -> int:
        """The row pad requests read (dummy page, length 1)."""
        return self.max_reqs

    def check_write(self, row: int, length: int) -> None:
        """Raise ``ValueError`` unless ``row`` may take an encoder output of ``length`` tokens."""
        if not 0 <= row < self.max_reqs:
            raise ValueError(f"encoder row {row} out of range [0, {self.max_reqs})")
        if not 1 <= length <= self.max_len:
            raise ValueError(
                f"encoder input of {length} tokens does not fit: it must be 1..{self.max_len} "
                "(max_encoder_len)"
            )

    def slots(self, row: int, length: int) -> torch.Tensor:
        """``encoder_out_cache_loc [length]`` int64: the slots of row ``row``'s encoder tokens."""
        start = row * self.max_pages * self.kv.page_size
        return torch.arange(start, start + length, dtype=torch.int64, device=self.kv.device)

    def write(self, row: int, kv: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Store one request's encoder K/V: ``kv[i] = (k, v)``, each ``[length, kv_heads,
        head_dim]``, for cross layer ``i``; then point row ``row`` of the table at them.

        Checks come first: a bad row, length or layer count raises with nothing written.
        """
        if len(kv) != self.kv.shape.num_layers:
            raise ValueError(
                f"{len(kv)} cross layers of K/V for an encoder cache of {self.kv.shape.num_layers}"
            )
        length = kv[0][0].shape[0] if kv else 0
        self.check_write(row, length)
        loc = self.slots(row, length)
        for layer, (k, v) in enumerate(kv):
            self.kv.store(layer, loc, k, v)
        used = -(-length // self.kv.page_size)
        first = row * self.max_pages
        self.pages[row].fill_(self.kv.dummy_page)
        self.pages[row, :used] = torch.arange(first, first + used, dtype=torch.int32, device=self.kv.device)
        self.lens[row] = length
        self.host_lens[row] = length

    def free(self, row: int) -> None:
        """Row ``row`` holds no encoder output any more (its request ended)."""
        if not 0 <= row < self.max_reqs:
            raise ValueError(f"encoder row {row} out of range [0, {self.max_reqs})")
        self.host_lens[row] = 0

    def check_rows(self, rows: np.ndarray) -> None:
        """Raise ``ValueError`` naming the first request row in ``rows`` (already in range)
        that holds no encoder output: a step of it would attend to nothing."""
        missing = self.host_lens[rows] == 0
        if missing.any():
            i = int(np.argmax(missing))
            raise ValueError(
                f"request row {int(rows[i])} (request {i} of the batch) has no encoder output: "
                "an encoder-decoder model needs its encoder input written first "
                "(model.encode_into(encoder, row, encoder_ids), or Engine.add_request(encoder_ids=...))"
            )
