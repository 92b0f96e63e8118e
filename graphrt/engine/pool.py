"""The engine's free request rows and KV pages: admitting waiting requests, giving rows back."""

from __future__ import annotations

from collections import deque
from typing import Any

from graphrt.engine.request import Request


class Pool:
    """Free ``req_to_token`` rows and KV pages of one engine (and its draft, when speculative).

    ``tables``: the request tables whose row a released request frees (the target's, and the
    draft's, which shares rows and pages with it).
    """

    def __init__(self, max_reqs: int, num_pages: int, page_size: int, tables: tuple[Any, ...]) -> None:
        self.rows = deque(range(max_reqs))
        self.pages = deque(range(num_pages))
        self.page_size, self.tables = page_size, tables

    def admit(self, waiting: deque[Request], lookahead: int) -> list[Request]:
        """Pop waiting requests (in order) while a row and their pages are free; gives each its
        row and pages. ``lookahead``: KV positions a request may write past its last token."""
        admitted = []
        while waiting and self.rows:
            req = waiting[0]
            need = -(-(len(req.prompt) + req.max_new_tokens + lookahead) // self.page_size)
            if need > len(self.pages):
                break
            waiting.popleft()
            req.req_idx = self.rows.popleft()
            req.pages = [self.pages.popleft() for _ in range(need)]
            admitted.append(req)
        return admitted

    def release(self, r: Request) -> None:
        """Give ``r``'s request row (its KV freed in each table's ledger) and pages back."""
        for table in self.tables:
            table.free(r.req_idx)
        self.rows.append(r.req_idx)
        self.pages.extend(r.pages)
        r.req_idx, r.pages = -1, []
