"""The fused Triton step update against its torch oracle: same req_to_token, same page table.

Runs on the GPU (``-m gpu``) and, when Triton's interpreter works here, on the CPU under
``TRITON_INTERPRET=1`` (set before triton is first imported, see ``conftest``-free check below).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from graphrt.buffers import Dims
from graphrt.kv import ReqToToken
from graphrt.metadata import kernels
from graphrt.metadata.buffer_groups import BufferGroups, Dummies
from graphrt.metadata.groups import Geometry
from graphrt.metadata.step import derive, derive_draft, gather_page_table, record_slots
from graphrt.step import Batch, ForwardMode, SpecGeometry
from tests.support.triton_util import INTERPRET, rerun_marks, rerun_under_interpreter, triton_devices


@pytest.fixture(autouse=True)
def _interpret(monkeypatch) -> None:
    if INTERPRET:
        monkeypatch.setenv(kernels.ENV, "interpret")


PS_CASES = [1, 16]


def _setup(ps: int, device: torch.device, max_ctx: int = 128, max_reqs: int = 6):
    num_pages = max_reqs * max_ctx // ps + 1
    dummy_slot = (num_pages - 1) * ps
    r2t = ReqToToken(max_reqs, max_ctx, ps, dummy_slot, device)
    gen = torch.Generator().manual_seed(ps)
    # NOTE: stale slots everywhere in live rows, as a reused row would hold.
    r2t.table[:max_reqs] = torch.randint(0, dummy_slot, (max_reqs, max_ctx), generator=gen).int().to(device)
    return r2t, num_pages


def _batch(
    mode: ForwardMode, seqs: list[int], qs: list[int], reqs: list[int], ps: int, steps: int = 1
) -> Batch:
    per_req = 128  # contiguous slots per request row
    if mode is ForwardMode.DRAFT_DECODE:
        loc = [r * per_req + s - 1 + i for r, s in zip(reqs, seqs, strict=True) for i in range(steps)]
    else:
        loc = [r * per_req + p for r, s, q in zip(reqs, seqs, qs, strict=True) for p in range(s - q, s)]
    return Batch.create(
        mode,
        input_ids=np.zeros(len(loc) // steps, dtype=np.int64),
        seq_lens=seqs,
        req_pool_indices=reqs,
        out_cache_loc=loc,
        q_lens=qs,
    )


def _groups(batch: Batch, rows: int, tokens: int, ps: int, device, spec=None, track=True):
    dims = Dims(rows, tokens, -(-128 // ps), 128)
    groups = BufferGroups(dims, device, Geometry(spec, page_size=ps), Dummies(0, 0, 6))
    groups.writers["step"].pages.track = track
    pad_q = 1 if batch.mode is not ForwardMode.TARGET_VERIFY else batch.num_tokens // max(batch.bs, 1)
    dummy_req = 6
    pad = {
        "dummy_slot": 0,
        "dummy_req": dummy_req,
        "pad_q_len": pad_q,
        "pad_seq_len": pad_q + 1,
        "pad_prefix_len": 1,
    }
    return groups, pad


def _run(batch, rows, tokens, ps, device, fused: bool, history: list[Batch] = (), spec=None, tree=False):
    r2t, _num_pages = _setup(ps, device)
    groups, pad = _groups(batch, rows, tokens, ps, device, spec, track=fused)
    pad["dummy_slot"] = r2t.dummy_slot
    r2t.table[-1] = r2t.dummy_slot
    step = groups.step.view(rows, tokens // rows)
    for b in [*history, batch]:  # earlier, longer batches leave pages the update must erase
        groups.write(b, rows, tokens, pad)
        if b.mode is ForwardMode.DRAFT_DECODE:
            draft = groups.groups["draft"].view(rows, tokens // rows).draft_loc
            if fused or tree:
                derive_draft(step, draft, r2t, ps, tree=tree)
            else:
                for i in range(draft.shape[1]):
                    s = dataclasses.replace(
                        step, out_cache_loc=draft[:, i], cache_seqlens=step.cache_seqlens + i
                    )
                    record_slots(s, r2t)
                gather_page_table(step, r2t, ps, draft.shape[1] - 1)
        elif fused:
            derive(step, r2t, ps)
        else:
            record_slots(step, r2t)
            gather_page_table(step, r2t, ps)
    return r2t.table.cpu(), step.page_table.cpu()


CASES = {
    "decode": (ForwardMode.DECODE, [37, 1, 120], [1, 1, 1], [3, 0, 5], 4, 4),
    "ragged": (ForwardMode.DRAFT_EXTEND, [20, 64, 3], [2, 4, 1], [1, 4, 2], 4, 16),
    "verify": (ForwardMode.TARGET_VERIFY, [40, 17], [4, 4], [0, 2], 3, 12),
}


@pytest.mark.parametrize("device", triton_devices())
@pytest.mark.parametrize("ps", PS_CASES)
@pytest.mark.parametrize("case", sorted(CASES))
def test_fused_matches_oracle(case: str, ps: int, device: torch.device) -> None:
    mode, seqs, qs, reqs, rows, tokens = CASES[case]
    batch = _batch(mode, seqs, qs, reqs, ps)
    longer = _batch(mode, [min(s + 60, 128) for s in seqs], qs, reqs, ps)
    table_t, pages_t = _run(batch, rows, tokens, ps, device, fused=False, history=[longer])
    table_f, pages_f = _run(batch, rows, tokens, ps, device, fused=True, history=[longer])
    assert torch.equal(table_f, table_t)
    assert torch.equal(pages_f, pages_t)
    need = [-(-s // ps) for s in seqs]
    dummy = (pages_t.max()).item()
    for r, n in enumerate(need):  # real pages, then only the dummy page (pad rows: one dummy page)
        assert (pages_t[r, n:] == dummy).all()


@pytest.mark.parametrize("device", triton_devices())
@pytest.mark.parametrize("ps", PS_CASES)
def test_fused_draft_chain_matches_oracle(ps: int, device: torch.device) -> None:
    spec = SpecGeometry(num_steps=4, topk=1)
    steps = spec.draft_forwards
    batch = _batch(ForwardMode.DRAFT_DECODE, [30, 90], [1, 1], [4, 1], ps, steps)
    longer = _batch(ForwardMode.DRAFT_DECODE, [100, 120], [1, 1], [4, 1], ps, steps)
    ref = _run(batch, 3, 3, ps, device, fused=False, history=[longer], spec=spec)
    got = _run(batch, 3, 3, ps, device, fused=True, history=[longer], spec=spec)
    assert torch.equal(got[0], ref[0]) and torch.equal(got[1], ref[1])


@pytest.mark.parametrize("device", triton_devices())
@pytest.mark.parametrize("ps", PS_CASES)
def test_fused_draft_tree_gathers_prefix_only(ps: int, device: torch.device, monkeypatch) -> None:
    spec = SpecGeometry(num_steps=3, topk=1)
    steps = spec.draft_forwards
    batch = _batch(ForwardMode.DRAFT_DECODE, [30, 90], [1, 1], [4, 1], ps, steps)
    longer = _batch(ForwardMode.DRAFT_DECODE, [100, 120], [1, 1], [4, 1], ps, steps)
    got = _run(batch, 3, 3, ps, device, fused=True, history=[longer], spec=spec, tree=True)
    monkeypatch.setenv(kernels.ENV, "0")  # the torch path of derive_draft: the oracle
    ref = _run(batch, 3, 3, ps, device, fused=False, history=[longer], spec=spec, tree=True)
    assert torch.equal(got[0], ref[0]) and torch.equal(got[1], ref[1])


@rerun_marks
def test_kernel_under_triton_interpreter() -> None:
    """On a CPU box: this file again, with the kernel run by Triton's interpreter."""
    rerun_under_interpreter(__file__, passed=10)
