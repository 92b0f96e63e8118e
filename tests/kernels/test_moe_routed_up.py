"""The skinny up kernel that routes itself (``_skinny_up_routed``, given a ``FusedRoute``) against
the router kernel followed by the plain skinny kernels: the same output bit for bit and the same
routing buffers (ids and weights, the fused shared experts' slots last, pad rows "no expert").
The grouped path, given a ``FusedRoute``, writes the routing first and matches too.

Runs on the GPU (``-m gpu``) and on the CPU under ``TRITON_INTERPRET=1``.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from graphrt.kernels import tuning
from graphrt.kernels.moe import align, new_routing
from graphrt.kernels.moe import triton_experts as te
from graphrt.kernels.moe.route_triton import FusedRoute, route_triton
from tests.support.moe_util import random_experts
from tests.support.triton_util import INTERPRET, rerun_marks, rerun_under_interpreter, triton_devices
from tests.support.tuning_util import patch_tuning

H, INTER = 64, 32
SMALL_TILES = te.Tiles(block_n=32, block_k=32, skinny_n=64, skinny_k=64)
#: ``(E, k, shared, scoring, renorm, scale, activation)``: Qwen3-like, DeepSeek-V2-Lite-like with
#: fused shared experts, gpt-oss-like (top-k then softmax, clamped SwiGLU with biases).
SPECS = [
    (8, 2, 0, "softmax", True, 1.0, "silu"),
    (12, 3, 2, "softmax", False, 2.5, "silu"),
    (8, 4, 0, "topk_softmax", False, 1.0, "swiglu_clamp"),
]


@pytest.fixture(autouse=True)
def _interpret(monkeypatch: pytest.MonkeyPatch) -> None:
    if INTERPRET:
        monkeypatch.setenv(te.ENV, "interpret")
        monkeypatch.setenv(align.ENV, "interpret")
        patch_tuning(monkeypatch, moe=SMALL_TILES)


def _layer(device, spec, tokens: int, real: int):
    experts, _, shared, scoring, renorm, scale, activation = spec
    gen = torch.Generator().manual_seed(experts * 10 + tokens)
    w = random_experts(
        experts + shared, H, INTER, bias=activation != "silu", activation=activation,
        dtype=torch.float32, device=device, seed=tokens,
    )  # fmt: skip
    # NOTE: distinct logits (a permutation in eighths): no tie for the two paths to order
    logits = torch.stack([torch.randperm(experts, generator=gen) for _ in range(tokens)]).float() / 8
    logits[real:] = float("nan")  # NOTE: a pad row's logits and input are poison
    x = torch.randn(tokens, H, generator=gen)
    x[real:] = float("nan")
    num_tokens = torch.tensor([real], dtype=torch.int32)
    route = FusedRoute(logits.to(device), num_tokens.to(device), scoring, renorm, scale, shared)
    return x.to(device), w, route


def _poisoned_routing(tokens: int, slots: int, experts: int, device):
    ids = torch.full((tokens, slots), -5, dtype=torch.int32, device=device)
    return new_routing(ids, torch.full((tokens, slots), -5.0, device=device), experts)


@pytest.mark.parametrize("device", triton_devices())
@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize(("tokens", "real", "path"), [(1, 1, "skinny"), (3, 2, "skinny"), (3, 2, "grouped")])
def test_routing_in_the_up_kernel_equals_routing_first(device, spec, tokens, real, path) -> None:
    x, w, route = _layer(device, spec, tokens, real)
    experts, topk, shared = spec[:3]
    slots = {"skinny": 1000, "grouped": 0}[path]
    first = _poisoned_routing(tokens, topk + shared, experts + shared, device)
    r = route
    route_triton(
        r.logits,
        r.num_tokens,
        first.topk_ids,
        first.topk_weights,
        r.scoring,
        r.renorm,
        r.scale,
        False,
        shared,
    )
    want = te.fused_experts_triton(x, w, first, skinny_slots=slots)
    fused = _poisoned_routing(tokens, topk + shared, experts + shared, device)
    got = te.fused_experts_triton(x, w, fused, skinny_slots=slots, route=route)
    assert torch.equal(fused.topk_ids, first.topk_ids) and torch.equal(fused.topk_weights, first.topk_weights)
    assert (fused.topk_ids[real:] == experts + shared).all(), "pad rows route to no expert"
    assert torch.equal(got[:real], want[:real]) and torch.equal(got[real:], torch.zeros_like(got[real:]))


@pytest.mark.parametrize("device", triton_devices())
def test_routing_in_the_up_kernel_with_the_down_split(device, monkeypatch) -> None:
    """The down kernel reads the ids the up kernel wrote (after its wait) in each of its parts."""
    base = SMALL_TILES if INTERPRET else tuning.active().moe
    patch_tuning(monkeypatch, moe=replace(base, skinny_down_split=2))
    spec = SPECS[1]
    x, w, route = _layer(device, spec, 3, 3)
    first = _poisoned_routing(3, 5, 14, device)
    route.write(first.topk_ids, first.topk_weights, pdl=False)
    want = te.fused_experts_triton(x, w, first, skinny_slots=1000)
    got = te.fused_experts_triton(x, w, _poisoned_routing(3, 5, 14, device), skinny_slots=1000, route=route)
    assert torch.equal(got, want)


def test_a_route_is_refused_where_it_cannot_hold() -> None:
    logits, tokens = torch.zeros(1, 8), torch.ones(1, dtype=torch.int32)
    with pytest.raises(ValueError, match="scoring 'sigmoid' is not one of the fused"):
        FusedRoute(logits, tokens, "sigmoid", True, 1.0)
    with pytest.raises(ValueError, match=r"9 routed slots .* cannot be chosen from 8 experts"):
        FusedRoute(logits, tokens, "softmax", True, 1.0).kernel_args(9)


@rerun_marks
def test_kernels_under_triton_interpreter() -> None:
    """On a CPU box: this file again, with the kernels run by Triton's interpreter."""
    rerun_under_interpreter(__file__, passed=11)
