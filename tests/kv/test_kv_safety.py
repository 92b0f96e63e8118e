"""KV safety: a replay writes exactly its real tokens' slots, plus the dummy slot for pad rows."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from graphrt import Batch
from tests.support.util import Setup, backends, build_runtime, decode_batch, prefill

CONTEXT = 64
LIVE = list(range(8))
BYSTANDER = 9  # prefilled, never in a batch
#: Written into the dummy slot before each replay, so a pad-row write there is visible.
SENTINEL = 7.0


def flat_caches(setup: Setup) -> list[torch.Tensor]:
    """Every K and V cache as ``[slots, num_kv_heads * head_dim]`` views (not copies)."""
    s = setup.kv.shape
    return [c.view(s.num_pages * s.page_size, -1) for c in (*setup.kv.k, *setup.kv.v)]


def written_slots(before: list[torch.Tensor], after: list[torch.Tensor]) -> set[int]:
    """Slots that differ in any layer's K or V."""
    changed: set[int] = set()
    for old, new in zip(before, after, strict=True):
        changed |= set((old != new).any(dim=1).nonzero().flatten().tolist())
    return changed


def assert_untouched_except(setup: Setup, snapshot: list[torch.Tensor], allowed: set[int], what: str) -> None:
    keep = torch.ones(snapshot[0].shape[0], dtype=torch.bool, device=snapshot[0].device)
    keep[sorted(allowed)] = False
    for i, (old, new) in enumerate(zip(snapshot, flat_caches(setup), strict=True)):
        assert torch.equal(old[keep], new[keep]), f"{what}: cache {i} changed outside {sorted(allowed)}"


def mark_dummy(setup: Setup) -> None:
    for cache in flat_caches(setup):
        cache[setup.kv.dummy_slot] = SENTINEL


def step(setup: Setup, batch: Batch) -> set[int]:
    """Run ``batch`` on its graph; returns the KV slots it wrote (after a fresh dummy mark)."""
    mark_dummy(setup)
    before = [c.clone() for c in flat_caches(setup)]
    table = setup.req_to_token.table.clone()
    setup.runtime.run(batch)
    # req_to_token changes exactly at the new tokens' (row, position) entries
    diff = (table != setup.req_to_token.table).nonzero().tolist()
    expected = sorted((int(r), int(p)) for r, p in zip(batch.req_pool_indices, batch.positions, strict=True))
    assert sorted(map(tuple, diff)) == expected
    rows = [int(r) for r in batch.req_pool_indices]
    assert setup.req_to_token.table[rows, batch.positions.tolist()].tolist() == batch.out_cache_loc.tolist()
    return written_slots(before, flat_caches(setup))


@pytest.mark.parametrize("page_size", [1, 16])
def test_replay_writes_only_new_tokens_and_dummy(device: torch.device, page_size: int) -> None:
    for backend in backends(device):
        # NOTE: a single bucket of 8, so the 3-request step runs 5 pad rows in the same graph.
        setup = build_runtime(
            device,
            backend=backend,
            page_size=page_size,
            max_context_len=CONTEXT,
            max_reqs=10,
            buckets=(8,),
        )
        rng = np.random.default_rng(page_size)
        lens = [int(n) for n in rng.integers(1, CONTEXT - 2, len(LIVE))]
        lens[0], lens[1] = 16, 15  # the next token opens a page / closes a page
        prefill(setup, [*LIVE, BYSTANDER], [*lens, CONTEXT - 1], rng)
        snapshot = [c.clone() for c in flat_caches(setup)]
        bystander_row = setup.req_to_token.table[BYSTANDER].clone()
        dummy = setup.kv.dummy_slot

        full = decode_batch(setup, LIVE, [n + 1 for n in lens], rng)
        new_full = {int(s) for s in full.out_cache_loc}
        assert step(setup, full) == new_full, "bs 8 in bucket 8 has no pad rows: no dummy write"

        reqs = [5, 0, 2]
        part = decode_batch(setup, reqs, [lens[r] + 2 for r in reqs], rng)
        new_part = {int(s) for s in part.out_cache_loc}
        assert dummy not in new_full | new_part
        assert step(setup, part) == new_part | {dummy}, "pad rows must write the dummy slot only"

        assert_untouched_except(setup, snapshot, new_full | new_part | {dummy}, backend)
        assert torch.equal(setup.req_to_token.table[BYSTANDER], bystander_row)
        assert setup.runtime.stats().replays == {"DECODE": 2}
