"""The request → KV-slot table, with a reserved dummy request row."""

from __future__ import annotations

import torch


class ReqToToken:
    """``req_to_token [max_reqs + 1, max_context_len]`` int32: KV slot of each request position.

    Row ``max_reqs`` is the dummy request: every entry is the dummy slot, so padded rows
    gather the dummy page. Each step writes its own tokens' slots (``out_cache_loc``) into
    the table before the page table is gathered from it.
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

    @property
    def dummy_req(self) -> int:
        return self.max_reqs
