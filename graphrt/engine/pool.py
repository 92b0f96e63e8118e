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
        self._offsets = np.arange(page_size, dtype=np.int64)
        #: Page key -> the running request computing that page (admitted, not cached yet).
        self._computing: dict[int, int] = {}
        self.cache = PrefixCache(page_size, self._pin, self._unpin, hash_fn) if prefix_caching else None

    def _slots(self, page: int) -> np.ndarray:
        return page * self.page_size + self._offsets

    def _pin(self, page: int, depth: int) -> None:
        positions = depth * self.page_size + self._offsets
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
        ones first, then idle cached ones, least recently used first); pages are counted on
        what a request computes, not its prompt. A request whose uncached pages a running
        request computes (admitted, its prompt not cached yet) is *deferred*: it stays
        waiting, in its place, the requests behind it are still considered, and it hits those
        pages once they are cached. So a burst over several shared prefixes prefills one
        request per prefix, then every other request with only its own tokens.
        """
        admitted, deferred = [], []
        while waiting and self.rows:
            req = waiting.popleft()
            hit, keys = self._match(req)
            if not self._computing.keys().isdisjoint(keys):
                # NOTE: a running request computes pages this one starts with: it hits them
                # once they are cached, instead of computing them again (a chunked prefill
                # caches its prompt after its last chunk, an unchunked one as it is launched)
                deferred.append(req)
                continue
            need = -(-(len(req.prompt) + req.max_new_tokens + lookahead) // self.page_size)
            spare = self.cache.evictable(hit) if self.cache is not None else 0
            if need - len(hit) > len(self.pages) + spare:
                waiting.appendleft(req)  # NOTE: first come first served for pages: no skipping
                break
            self._computing.update(dict.fromkeys(keys, req.rid))
            self._give(req, hit, need)
            admitted.append(req)
        waiting.extendleft(reversed(deferred))
        return admitted

    def _give(self, req: Request, hit: list[int], need: int) -> None:
        """``req`` takes a row, the cached pages ``hit`` (adopted by its row) and fresh pages
        up to ``need``."""
        req.req_idx = self.rows.popleft()
        if self.cache is not None:
            self.cache.acquire(hit)
            self.cache.count(len(hit), len(req.prompt))
        req.pages = hit + [self._page() for _ in range(need - len(hit))]
        req.cached = req.prefilled = len(hit) * self.page_size
        if hit:
            # NOTE: every hit page's slots in one op (a request adopts dozens of pages)
            slots = (np.asarray(hit, dtype=np.int64)[:, None] * self.page_size + self._offsets).ravel()
            for table in self.tables:
                table.adopt(req.req_idx, slots)

    def _match(self, req: Request) -> tuple[list[int], list[int]]:
        """``req``'s cached pages (:meth:`PrefixCache.match`) and the keys of the full pages it
        would compute; both empty without caching. Its page keys are hashed once per request
        (``Request.page_keys``), however many steps it waits."""
        if self.cache is None:
            return [], []
        keys = self._keys(req)
        hit = self.cache.match(req.prompt, keys)
        return hit, keys[len(hit) :]

    def _keys(self, req: Request) -> list[int]:
        """``req``'s page keys, hashed on first use (``Request.page_keys``); caching only."""
        assert self.cache is not None
        if req.page_keys is None:
            req.page_keys = self.cache.keys(req.prompt)
        return req.page_keys

    def _page(self) -> int:
        if self.pages:
            return self.pages.popleft()
        assert self.cache is not None, "admit checks the free pages first"
        return self.cache.evict()

    def cache_prompt(self, r: Request) -> None:
        """After ``r``'s prefill has run: cache its full prompt pages past those it adopted
        (no-op without caching)."""
        if self.cache is not None:
            self.cache.insert(r.prompt, r.pages, self._keys(r), r.cached // self.page_size)
            self._settle(r)

    def _settle(self, r: Request) -> None:
        """``r`` computes none of its pages any more (cached, or given back unfinished)."""
        if self._computing and r.page_keys is not None:
            for key in r.page_keys[r.cached // self.page_size :]:
                if self._computing.get(key) == r.rid:
                    del self._computing[key]

    def release(self, r: Request) -> None:
        """Give ``r``'s request row (its KV freed in each table's ledger) and pages back; its
        cached pages stay cached (idle once no request holds them)."""
        self._settle(r)
        for table in self.tables:
            table.free(r.req_idx)
        self.rows.append(r.req_idx)
        self.pages.extend(self.cache.release(r.pages) if self.cache is not None else r.pages)
        r.req_idx, r.pages, r.cached = -1, [], 0
