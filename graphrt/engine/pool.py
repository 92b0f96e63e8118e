"""The engine's free request rows and KV pages: admitting waiting requests, giving rows back."""

from __future__ import annotations

from collections import deque
from typing import Any

import numpy as np

from graphrt.engine.prefix_cache import HashFn, PrefixCache, chain_hash
from graphrt.engine.request import Request


class Pool:
    """Free ``req_to_token`` rows and KV pages of one engine (and its draft, when speculative).

    ``tables``: the request tables whose row a released request frees (the target's, and the
    draft's, which shares rows and pages with it). ``prefix_caching``: keep full prompt pages
    in a :class:`~graphrt.engine.prefix_cache.PrefixCache` (pinned in every table's ledger),
    reused by later prompts that start the same; ``hash_fn`` replaces its chain hash (tests).
    """

    def __init__(
        self,
        max_reqs: int,
        num_pages: int,
        page_size: int,
        tables: tuple[Any, ...],
        *,
        prefix_caching: bool = False,
        hash_fn: HashFn = chain_hash,
    ) -> None:
        self.rows = deque(range(max_reqs))
        self.pages = deque(range(num_pages))
        self.page_size, self.tables = page_size, tables
        self.cache = PrefixCache(page_size, self._pin, self._unpin, hash_fn) if prefix_caching else None

    def _slots(self, page: int) -> np.ndarray:
        return page * self.page_size + np.arange(self.page_size, dtype=np.int64)

    def _pin(self, page: int, depth: int) -> None:
        positions = depth * self.page_size + np.arange(self.page_size, dtype=np.int64)
        for table in self.tables:
            table.pin(self._slots(page), positions)

    def _unpin(self, page: int) -> None:
        for table in self.tables:
            table.unpin(self._slots(page))

    def unheld(self) -> list[int]:
        """Pages no request holds: the free ones and the idle cached ones (evictable)."""
        return [*self.pages, *(self.cache.idle() if self.cache is not None else ())]

    @property
    def available(self) -> int:
        """How many pages a request could be given now (:meth:`unheld`)."""
        return len(self.pages) + (self.cache.evictable(()) if self.cache is not None else 0)

    def admit(self, waiting: deque[Request], lookahead: int) -> list[Request]:
        """Pop waiting requests (in order) while a row and their pages are free; gives each its
        row and pages. ``lookahead``: KV positions a request may write past its last token.

        With prefix caching a request's first pages are the cached ones its prompt starts
        with (adopted by its row: ``Request.cached`` positions), the rest fresh pages (free
        ones first, then idle cached ones, least recently used first); a request whose
        uncached pages another request admitted in this call computes waits for the next.
        """
        admitted, pending = [], set()
        while waiting and self.rows:
            req = waiting[0]
            need = -(-(len(req.prompt) + req.max_new_tokens + lookahead) // self.page_size)
            hit = self.cache.match(req.prompt) if self.cache is not None else []
            keys = self.cache.keys(req.prompt)[len(hit) :] if self.cache is not None else []
            if pending.intersection(keys):
                # NOTE: a request admitted now computes pages this one starts with: it waits a
                # step for them to be cached (requests sharing a prompt arrive together).
                break
            pending.update(keys)
            spare = self.cache.evictable(hit) if self.cache is not None else 0
            if need - len(hit) > len(self.pages) + spare:
                break
            waiting.popleft()
            req.req_idx = self.rows.popleft()
            if self.cache is not None:
                self.cache.acquire(hit)
                self.cache.count(len(hit), len(req.prompt))
            req.pages = hit + [self._page() for _ in range(need - len(hit))]
            req.cached = req.prefilled = len(hit) * self.page_size
            if hit:
                slots = np.concatenate([self._slots(p) for p in hit])
                for table in self.tables:
                    table.adopt(req.req_idx, slots)
            admitted.append(req)
        return admitted

    def _page(self) -> int:
        if self.pages:
            return self.pages.popleft()
        assert self.cache is not None, "admit checks the free pages first"
        return self.cache.evict()

    def cache_prompt(self, r: Request) -> None:
        """After ``r``'s prefill has run: cache its full prompt pages (no-op without caching)."""
        if self.cache is not None:
            self.cache.insert(r.prompt, r.pages)

    def release(self, r: Request) -> None:
        """Give ``r``'s request row (its KV freed in each table's ledger) and pages back; its
        cached pages stay cached (idle once no request holds them)."""
        for table in self.tables:
            table.free(r.req_idx)
        self.rows.append(r.req_idx)
        self.pages.extend(self.cache.release(r.pages) if self.cache is not None else r.pages)
        r.req_idx, r.pages, r.cached = -1, [], 0
