"""The request → KV-slot table, with a reserved dummy request row and a host ledger of what each row holds."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from graphrt.kv.ledger import KVLedger, KVWrites
from graphrt.kv.move import move_slots
from graphrt.kv.ownership import KVIsolationError


class ReqToToken:
    """``req_to_token [max_reqs + 1, max_context_len]`` int32: KV slot of each request position.

    Row ``max_reqs`` is the dummy request: every entry is the dummy slot, so padded rows
    gather the dummy page. Each step writes its own tokens' slots (``out_cache_loc``) into
    the table before the page table is gathered from it.

    ``ledger`` (host) knows how many positions each row has validly written since it was
    (re)assigned and which row holds each live slot; ``GraphRuntime.run`` checks every step
    against it before writing anything (see :mod:`graphrt.kv.ledger`). A scheduler calls
    :meth:`free` when a request finishes and :meth:`share_prefix` for prefix-cache hits.
    """

    def __init__(
        self,
        max_reqs: int,
        max_context_len: int,
        page_size: int,
        dummy_slot: int,
        device: torch.device,
    ) -> None:
        self.max_reqs, self.max_context_len, self.page_size = max_reqs, max_context_len, page_size
        self.dummy_slot = dummy_slot
        self.table = torch.full((max_reqs + 1, max_context_len), dummy_slot, dtype=torch.int32, device=device)
        # NOTE: column j*page_size of a row holds the first slot of the row's page j.
        self.page_starts = torch.arange(0, max_context_len, page_size, device=device)
        self.ledger = KVLedger(max_reqs, max_context_len, dummy_slot, page_size)
        # NOTE: one read-only view, made once: callers read it every step.
        self._valid_view = self.ledger.valid_lens.view()
        self._valid_view.flags.writeable = False

    @property
    def dummy_req(self) -> int:
        """The reserved row pad requests use (one past the last real row)."""
        return self.max_reqs

    @property
    def valid_lens(self) -> np.ndarray:
        """``[max_reqs]`` int64: positions each row has validly written (read-only view)."""
        return self._valid_view

    def free(self, row: int) -> None:
        """Release ``row`` and its slots: it reads nothing until a step writes it from 0."""
        self._check_row("row", row)
        self.ledger.free(row)

    def share_prefix(
        self, src: int, dst: int, length: int, *, copy_into: int | None = None, kv: Any = None
    ) -> None:
        """Let row ``dst`` hold row ``src``'s positions ``0..length-1`` (a prefix-cache hit).

        ``dst`` is freed first. Whole pages are shared: they stay live while either row holds
        them, and are read-only for both (``dst`` writes its own pages from ``length`` on).
        A ``length`` that ends inside a page raises ``KVIsolationError`` (``dst`` would write
        its next positions into a page it shares), unless ``copy_into`` names a free page of
        ``kv`` (the cache this table indexes): the partial page's KV is then copied there on
        the device (copy-on-write) and that page is ``dst``'s own.
        """
        self._check_row("src", src)
        self._check_row("dst", dst)
        whole = length - length % self.page_size
        if copy_into is None or whole == length:
            self.ledger.share_prefix(src, dst, length)
            self.table[dst, :length] = self.table[src, :length]
            return
        if kv is None:
            raise ValueError("share_prefix(copy_into=...) needs kv=, the cache whose page it copies")
        self._check_copy_page(copy_into, dst)
        self.ledger.share_prefix(src, dst, whole)
        self.table[dst, :whole] = self.table[src, :whole]
        n = length - whole
        own = copy_into * self.page_size + np.arange(n)
        req = np.zeros(n, dtype=np.int64)
        writes = KVWrites(np.array([dst]), np.array([whole]), np.array([n]), own, req, whole + np.arange(n))
        self.ledger.check(writes)  # NOTE: passes: the page was checked free above
        theirs = self.ledger.table[src, whole:length].astype(np.int64)
        move_slots(kv, torch.as_tensor(theirs, device=kv.device), torch.as_tensor(own, device=kv.device))
        self.ledger.commit(writes)
        self.table[dst, whole:length] = torch.as_tensor(own, dtype=torch.int32)

    def _check_copy_page(self, page: int, dst: int) -> None:
        """``page`` must be a live page no row but ``dst`` (freed first) holds."""
        pages = self.ledger.refs.size
        if not 0 <= page < pages:
            raise ValueError(f"copy_into page {page} out of range [0, {pages}) (page {pages} is the dummy)")
        others = [r for r in self.ledger.holders(page).tolist() if r != dst]
        if others:
            raise KVIsolationError(f"share_prefix: copy_into page {page} is held by live row {others[0]}")

    def _check_row(self, name: str, row: int) -> None:
        if not 0 <= row < self.max_reqs:
            raise ValueError(
                f"{name} {row} out of range [0, {self.max_reqs}) (row {self.max_reqs} is the dummy)"
            )
