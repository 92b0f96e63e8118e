"""The expert alignment (``graphrt.kernels.moe.align``): the Triton program against the torch
reference (bit for bit), and the reference against a plain Python grouping of the slots.

The kernel runs on the GPU (``-m gpu``) and on the CPU under ``TRITON_INTERPRET=1``.
"""

from __future__ import annotations

import pytest
import torch

from graphrt.kernels.moe import BLOCK_M, align_bound, block_bound, new_routing
from graphrt.kernels.moe import align as al
from tests.support.moe_util import random_routing
from tests.support.triton_util import INTERPRET, rerun_marks, rerun_under_interpreter, triton_devices

FIELDS = ("sorted_ids", "block_experts", "num_padded", "expert_counts")
#: ``(T, k, E, pad rows)``: one token, pad rows first / middle / last, every row a pad row.
CASES = [(1, 2, 8, ()), (3, 2, 8, (1,)), (16, 2, 8, (0, 15)), (9, 8, 64, (4,)), (2, 2, 8, (0, 1))]


@pytest.fixture(autouse=True)
def _interpret(monkeypatch: pytest.MonkeyPatch) -> None:
    if INTERPRET:
        monkeypatch.setenv(al.ENV, "interpret")


def _expected(ids: torch.Tensor, num_experts: int) -> dict[str, list[int]]:
    """The alignment by hand: slots per expert in order, padded runs, blocks, counts."""
    flat, slots = ids.reshape(-1).tolist(), ids.numel()
    sorted_ids, block_experts, counts = [], [], []
    for e in range(num_experts):
        mine = [s for s, got in enumerate(flat) if got == e]
        counts.append(len(mine))
        padded = -(-len(mine) // BLOCK_M) * BLOCK_M
        sorted_ids += mine + [slots] * (padded - len(mine))
        block_experts += [e] * (padded // BLOCK_M)
    tokens, topk = ids.shape
    total = len(sorted_ids)
    sorted_ids += [slots] * (align_bound(tokens, topk, num_experts) - total)
    block_experts += [-1] * (block_bound(tokens, topk, num_experts) - len(block_experts))
    return {
        "sorted_ids": sorted_ids,
        "block_experts": block_experts,
        "num_padded": [total],
        "expert_counts": counts,
    }


@pytest.mark.parametrize(("tokens", "topk", "experts", "pads"), CASES)
def test_reference_groups_slots_by_expert(tokens, topk, experts, pads) -> None:
    routing = random_routing(tokens, topk, experts, "cpu", pad_rows=pads, seed=tokens)
    al.align_reference(routing.topk_ids, experts, routing)
    want = _expected(routing.topk_ids, experts)
    assert {f: getattr(routing, f).tolist() for f in FIELDS} == want
    assert sum(want["expert_counts"]) == (tokens - len(pads)) * topk  # NOTE: pad rows counted nowhere


@pytest.mark.parametrize("device", triton_devices())
@pytest.mark.parametrize(("tokens", "topk", "experts", "pads"), CASES)
def test_kernel_equals_reference(device, tokens, topk, experts, pads) -> None:
    """Stale values in every buffer beforehand: the kernel overwrites all of them."""
    ours = random_routing(tokens, topk, experts, device, pad_rows=pads, seed=tokens)
    for f in FIELDS:
        getattr(ours, f).fill_(-7)
    ref = new_routing(ours.topk_ids.cpu(), ours.topk_weights.cpu(), experts)
    al.moe_align(ours.topk_ids, experts, ours)
    al.align_reference(ref.topk_ids, experts, ref)
    for f in FIELDS:
        assert torch.equal(getattr(ours, f).cpu(), getattr(ref, f)), f


@pytest.mark.parametrize("device", triton_devices())
def test_kernel_takes_buffers_longer_than_the_bounds(device) -> None:
    """Views of a group sized for a larger bucket: the tail gets the sentinel and -1."""
    ids = random_routing(5, 4, 16, device, pad_rows=(2,)).topk_ids
    big = new_routing(torch.zeros(40, 4, dtype=torch.int32, device=device), ids.float(), 16)
    big.topk_ids = ids
    al.moe_align(ids, 16, big)
    want = _expected(ids.cpu(), 16)
    n, b = len(want["sorted_ids"]), len(want["block_experts"])
    assert big.sorted_ids[:n].tolist() == want["sorted_ids"] and set(big.sorted_ids[n:].tolist()) == {20}
    assert big.block_experts[:b].tolist() == want["block_experts"] and set(
        big.block_experts[b:].tolist()
    ) == {-1}


def test_refuses_short_buffers_and_wrong_ids() -> None:
    routing = random_routing(4, 2, 8, "cpu")
    short = new_routing(routing.topk_ids[:3], routing.topk_weights[:3], 8)
    with pytest.raises(ValueError, match=r"routing.sorted_ids is \(96,\).*at least 128"):
        al.moe_align(routing.topk_ids, 8, short)
    with pytest.raises(ValueError, match="topk_ids must be a contiguous"):
        al.moe_align(routing.topk_ids.long(), 8, routing)
    before = routing.sorted_ids.clone()
    with pytest.raises(ValueError, match=r"routing.expert_counts is \(8,\).*at least 9"):
        al.moe_align(routing.topk_ids, 9, routing)
    assert torch.equal(routing.sorted_ids, before)  # NOTE: refused before writing anything


@rerun_marks
def test_kernel_under_triton_interpreter() -> None:
    """On a CPU box: this file again, with the kernel run by Triton's interpreter."""
    rerun_under_interpreter(__file__, passed=12)
