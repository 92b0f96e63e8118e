"""The request → KV-slot table, with a reserved dummy request row and a host ledger of what each row holds."""

from __future__ import annotations

import numpy as np
import torch

from graphrt.kv import pins
from graphrt.kv.ledger import KVIsolationError, KVLedger
from graphrt.kv.window import WindowPool


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
        self.max_reqs, self.max_context_len = max_reqs, max_context_len
        self.dummy_slot = dummy_slot
        self.table = torch.full((max_reqs + 1, max_context_len), dummy_slot, dtype=torch.int32, device=device)
        # NOTE: column j*page_size of a row holds the first slot of the row's page j.
        self.page_starts = torch.arange(0, max_context_len, page_size, device=device)
        self.ledger = KVLedger(max_reqs, max_context_len, dummy_slot, page_size)
        # NOTE: one read-only view, made once: callers read it every step.
        self._valid_view = self.ledger.valid_lens.view()
        self._valid_view.flags.writeable = False
        #: The window-layer pool whose pages each row also holds, if the runtime has one.
        self.window: WindowPool | None = None

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
        if self.window is not None:
            self.window.free(row)

    def share_prefix(self, src: int, dst: int, length: int) -> None:
        """Let row ``dst`` hold row ``src``'s positions ``0..length-1`` (a prefix-cache hit).

        ``dst`` is freed first; the shared slots stay live while either row holds them, and
        neither row may write them again (``dst`` writes its own slots from ``length`` on).
        """
        self._check_row("src", src)
        self._check_row("dst", dst)
        if self.window is not None:
            # NOTE: a window page has one owner; a shared prefix would give its last pages two.
            raise KVIsolationError(
                f"share_prefix({src}, {dst}, {length}): prefixes are not shared with a window KV pool"
            )
        self.ledger.share_prefix(src, dst, length)
        self.table[dst, :length] = self.table[src, :length]

    # ---- a prefix cache's pages (graphrt.kv.pins) -----------------------------------------
    def pin(self, slots: np.ndarray, positions: np.ndarray) -> None:
        """A prefix cache keeps ``slots`` (int64 ``[n]``, holding ``positions``) past their rows."""
        self._no_window("pin")
        pins.pin(self.ledger, slots, positions)

    def unpin(self, slots: np.ndarray) -> None:
        """A prefix cache evicts ``slots``; refused while a live row holds one."""
        pins.unpin(self.ledger, slots)

    def adopt(self, row: int, slots: np.ndarray) -> None:
        """Row ``row`` (freed first) holds the cached ``slots`` as positions ``0 .. n-1``: a
        prefix-cache hit. Its next step writes from position ``n`` on, in pages of its own."""
        self._check_row("row", row)
        self._no_window("adopt")
        pins.adopt(self.ledger, row, slots)
        host = torch.from_numpy(slots.astype(np.int32))
        if self.table.device.type == "cuda":
            # NOTE: pinned, so the copy is stream-ordered and the host does not wait for the
            # steps in flight (a pageable copy syncs: each hit would stall the overlapped host)
            host = host.pin_memory()
        self.table[row, : slots.size] = host.to(self.table.device, non_blocking=True)

    def _no_window(self, what: str) -> None:
        if self.window is not None:
            # NOTE: a window page has one owner and is released once out of the window.
            raise KVIsolationError(f"{what}: prefix caching does not combine with a window KV pool")

    def _check_row(self, name: str, row: int) -> None:
        if not 0 <= row < self.max_reqs:
            raise ValueError(
                f"{name} {row} out of range [0, {self.max_reqs}) (row {self.max_reqs} is the dummy)"
            )
