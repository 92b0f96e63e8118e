"""KV isolation per mode: what each speculative mode reads, writes and commits to the ledger."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from graphrt import ForwardMode
from graphrt.kv.ledger import KVIsolationError, KVLedger, KVWrites
from graphrt.step.modes import SpecGeometry
from tests.runtime.test_spec_modes import draft_batch, filled, setup_for, verify_batch
from tests.support.state import assert_same_state, state_of
from tests.support.util import decode_batch, prefill, remade, slot_of, spec_batch

M = ForwardMode


def test_chain_draft_commits_its_positions(device: torch.device) -> None:
    spec = SpecGeometry(num_steps=3)  # 2 draft forwards at positions seq_len-1, seq_len
    setup = setup_for(device, spec)
    rng = np.random.default_rng(0)
    lens = filled(setup, rng)
    reqs = [1, 3]
    setup.runtime.run(draft_batch(setup, spec, reqs, lens, rng))
    ledger = setup.req_to_token.ledger
    for r in reqs:
        assert ledger.valid_lens[r] == lens[r] + 2
        assert ledger.owner[[slot_of(setup, r, lens[r] + i) for i in range(2)]].tolist() == [r, r]
    # verify from the pending position rewrites the drafts' positions with the same slots
    setup.runtime.run(verify_batch(setup, spec, reqs, lens, rng))
    assert [int(ledger.valid_lens[r]) for r in reqs] == [lens[r] + spec.num_draft_tokens for r in reqs]
    # draft-extend of 1 accepted token: the row keeps lens + 1, the rest is released
    setup.runtime.run(spec_batch(setup, M.DRAFT_EXTEND, reqs, [lens[r] + 1 for r in reqs], [1, 1], rng))
    assert ledger.owner[slot_of(setup, 1, lens[1] + 1)] == -1


@pytest.mark.parametrize("eager", [False, True], ids=["graph", "eager"])
def test_tree_draft_scratch_slots(device: torch.device, eager: bool) -> None:
    """Tree drafts write scratch slots that enter no row; a scratch slot another live row
    holds is refused, and nothing is written."""
    spec = SpecGeometry(num_steps=3, topk=2, num_draft_tokens=5)
    setup = setup_for(device, spec, page_size=1)
    rng = np.random.default_rng(1)
    lens = filled(setup, rng)
    batch = draft_batch(setup, spec, [0, 2], lens, rng)
    held = slot_of(setup, 1, 0)
    bad = remade(batch, out_cache_loc=np.concatenate([[held], batch.out_cache_loc[1:]]))
    before = state_of(setup.runtime)
    with pytest.raises(KVIsolationError, match=rf"request 0 \(row 0\) writes KV slot {held} .*live row 1"):
        setup.runtime.run(bad, eager=eager)
    assert_same_state(setup.runtime, before)
    table = setup.req_to_token.table.clone()
    setup.runtime.run(batch, eager=eager)
    ledger = setup.req_to_token.ledger
    assert (ledger.owner[batch.out_cache_loc] == -1).all(), "scratch slots belong to no row"
    assert [int(ledger.valid_lens[r]) for r in (0, 2)] == [lens[0], lens[2]]
    assert torch.equal(setup.req_to_token.table, table), "a tree draft records no slot"


def test_verify_reads_only_written_positions(device: torch.device) -> None:
    spec = SpecGeometry(num_steps=3)
    setup = setup_for(device, spec)
    rng = np.random.default_rng(2)
    lens = filled(setup, rng)
    grown = [n + 2 for n in lens]  # two positions past what the rows hold
    batch = verify_batch(setup, spec, [4], grown, rng)
    with pytest.raises(
        KVIsolationError, match=rf"row 4\) reads KV positions 0\.\.{lens[4] + 1}.*limit {lens[4]}"
    ):
        setup.runtime.run(batch)


def test_failed_step_drops_what_it_may_have_written(device: torch.device) -> None:
    """A forward that raises mid-step leaves the row valid only below the step's first position."""
    setup = setup_for(device, SpecGeometry(num_steps=3))
    rng = np.random.default_rng(3)
    prefill(setup, [0], [20], rng)

    def boom(*args: object) -> None:
        raise RuntimeError("model failed")

    setup.model.forward = boom  # type: ignore[method-assign]
    with pytest.raises(RuntimeError, match="model failed"):
        setup.runtime.run(decode_batch(setup, [0], [15], rng), eager=True)
    assert setup.req_to_token.valid_lens[0] == 14
    assert setup.req_to_token.ledger.owner[slot_of(setup, 0, 14)] == -1


def test_ledger_truncates_shared_rows_in_one_pass() -> None:
    """Two rows sharing a prefix both drop it in one vectorised truncate: refs reach 0 once."""
    ledger = KVLedger(max_reqs=3, max_context_len=8, num_slots=32)
    rows, starts = np.array([0]), np.array([0])
    slots = np.arange(10, 16)
    ledger.commit(KVWrites(rows, starts, np.array([6]), slots, np.zeros(6, np.int64), np.arange(6)))
    ledger.share_prefix(0, 1, 4)
    assert ledger.refs[10:16].tolist() == [2, 2, 2, 2, 1, 1]
    ledger.truncate(np.array([0, 1]), np.array([2, 1]))
    assert ledger.refs[10:16].tolist() == [2, 1, 0, 0, 0, 0]
    assert ledger.owner[10:16].tolist() == [0, 0, -1, -1, -1, -1]
    assert ledger.valid_lens.tolist() == [2, 1, 0]
    assert ledger.holder(11) == 0 and ledger.holder(12) == -1
