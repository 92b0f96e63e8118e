"""The fused router (``graphrt.kernels.moe.route_triton``) against the torch routers
(``graphrt.models.router.route`` + ``write_routing``): same experts in the same order, weights
within float32 rounding, pad rows (poisoned with NaN) written as "no expert" with weight 0; a
fused shared expert's slots last (ids ``E ..``, weight 1; a pad row's the id ``E + S``).

The kernel runs on the GPU (``-m gpu``) and on the CPU under ``TRITON_INTERPRET=1``.
"""

from __future__ import annotations

import pytest
import torch

from graphrt.kernels.moe import align as al
from graphrt.kernels.moe import new_routing
from graphrt.kernels.moe.route_triton import route_triton
from graphrt.models.moe_config import MoESpec
from graphrt.models.router import route, route_all, route_into, write_routing
from tests.support.triton_util import INTERPRET, triton_devices

#: ``(E, k, scoring, renorm, scale)``: Qwen3 / Mixtral, DeepSeek-V2 greedy, gpt-oss, E not a power of 2.
SPECS = [
    (8, 2, "softmax", True, 1.0),
    (64, 6, "softmax", False, 16.0),
    (32, 4, "topk_softmax", False, 1.0),
    (60, 8, "softmax", True, 2.5),
    (128, 8, "softmax", True, 1.0),
]


@pytest.fixture(autouse=True)
def _interpret(monkeypatch: pytest.MonkeyPatch) -> None:
    if INTERPRET:
        monkeypatch.setenv(al.ENV, "interpret")


def _spec(experts: int, topk: int, scoring: str, renorm: bool, scale: float) -> MoESpec:
    return MoESpec(
        experts, topk, 16, (True,), scoring=scoring, norm_topk_prob=renorm, routed_scaling_factor=scale
    )


def _case(device: torch.device, experts: int, topk: int, tokens: int, real: int, dtype: torch.dtype):
    gen = torch.Generator().manual_seed(experts * 100 + tokens)
    # NOTE: distinct logits, exact in bf16 (eighths below 16): a tie's order is torch.topk's choice
    perms = torch.stack([torch.randperm(experts, generator=gen) for _ in range(tokens)])
    logits = ((perms.float() - experts / 2) / 8).to(device=device, dtype=dtype)
    logits[real:] = float("nan")  # NOTE: pad rows carry poison; it must reach no buffer
    num_tokens = torch.tensor([real], dtype=torch.int32, device=device)
    ids = torch.full((tokens, topk), -5, dtype=torch.int32, device=device)
    weights = torch.full((tokens, topk), -5.0, device=device)
    return logits, num_tokens, ids, weights


@pytest.mark.parametrize("device", triton_devices())
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("experts", "topk", "scoring", "renorm", "scale"), SPECS)
@pytest.mark.parametrize(("tokens", "real"), [(1, 1), (5, 5), (16, 9)])
def test_fused_router_equals_torch(
    device, dtype, experts, topk, scoring, renorm, scale, tokens, real
) -> None:
    spec = _spec(experts, topk, scoring, renorm, scale)
    logits, num_tokens, ids, weights = _case(device, experts, topk, tokens, real, dtype)
    route_triton(logits, num_tokens, ids, weights, scoring, renorm, scale, False)
    want = new_routing(ids.clone(), weights.clone(), experts)
    w, i = route(logits, spec)
    write_routing(want, num_tokens, w, i)
    assert torch.equal(ids[:real], want.topk_ids[:real])
    torch.testing.assert_close(weights[:real], want.topk_weights[:real], atol=1e-6, rtol=1e-5)
    assert (ids[real:] == experts).all() and (weights[real:] == 0).all()


@pytest.mark.parametrize("device", triton_devices())
def test_ties_go_to_the_lower_expert(device) -> None:
    """Equal scores: the lower expert ids, in order (a stable top-k)."""
    logits = torch.zeros(2, 8, device=device)
    logits[:, 5] = 1.0
    ids = torch.zeros(2, 3, dtype=torch.int32, device=device)
    weights = torch.zeros(2, 3, device=device)
    route_triton(logits, torch.tensor([2], device=device), ids, weights, "softmax", True, 1.0, False)
    assert ids.tolist() == [[5, 0, 1], [5, 0, 1]]


@pytest.mark.parametrize("device", triton_devices())
def test_route_into_takes_the_kernel_for_softmax_scorings(device, monkeypatch) -> None:
    """``route_into`` runs the fused kernel (it leaves a NaN pad row's buffers clean) where
    the switch allows, and the torch ops when the switch is off: the same buffers."""
    spec = _spec(16, 4, "softmax", True, 1.0)
    logits, num_tokens, ids, weights = _case(device, 16, 4, 6, 4, torch.float32)
    fused = new_routing(ids.clone(), weights.clone(), 16)
    route_into(fused, num_tokens, logits, spec)
    monkeypatch.setenv(al.ENV, "0")
    plain = new_routing(ids.clone(), weights.clone(), 16)
    route_into(plain, num_tokens, logits, spec)
    assert torch.equal(fused.topk_ids, plain.topk_ids)
    torch.testing.assert_close(fused.topk_weights, plain.topk_weights, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("device", triton_devices())
@pytest.mark.parametrize("shared", [1, 2, 3])
def test_fused_router_writes_the_shared_slots(device, shared) -> None:
    """DeepSeek-V2 greedy with ``shared`` fused shared experts: the kernel == ``route_all`` +
    ``write_routing`` (routed slots first, then ids ``E .. E + S - 1`` weight 1); pad rows
    ``E + S`` and 0 in every slot."""
    experts, topk, tokens, real = 16, 3, 7, 5
    spec = MoESpec(experts, topk, 16, (True,), routed_scaling_factor=2.0, shared_size=16 * shared)
    logits, num_tokens, ids, weights = _case(device, experts, topk + shared, tokens, real, torch.float32)
    route_triton(logits, num_tokens, ids, weights, "softmax", False, 2.0, False, shared)
    want = new_routing(ids.clone(), weights.clone(), experts + shared)
    write_routing(want, num_tokens, *route_all(logits, spec))
    assert torch.equal(ids, want.topk_ids)
    torch.testing.assert_close(weights, want.topk_weights, atol=1e-6, rtol=1e-5)
    assert ids[:real, topk:].tolist() == [list(range(experts, experts + shared))] * real
    assert (weights[:real, topk:] == 1).all() and (weights[:real, :topk] < 2).all()
    assert (ids[real:] == experts + shared).all() and (weights[real:] == 0).all()
