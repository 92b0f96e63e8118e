"""A shared expert fused into the routed experts (``MoESpec.shared_slots``) == the separate MLP.

DeepSeek's shared expert of ``S I`` intermediate columns held as ``S`` extra experts that every
real token routes to with weight 1: the layer's output equals the same weights run as a separate
dense MLP (fp32, ``ATOL``), through the torch router and experts, the fused Triton router and
expert kernels (interpreter on the CPU), and a layer without routing buffers. Pad rows get the
id past every expert (``E + S``) and weight 0. Under tensor parallelism each rank's partial sum,
its slices of the shared expert's pieces loaded from the checkpoint tensors included, adds up to
the whole layer's output. Which specs fuse.
"""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch

from graphrt.checkpoints.shared_experts import shared_expert_slots
from graphrt.kernels.moe import align as al
from graphrt.kernels.moe import experts_reference, new_routing
from graphrt.metadata.routing import RoutingShape
from graphrt.models.moe import SparseMoE
from graphrt.models.moe_config import MoESpec
from graphrt.models.parallel import SINGLE
from graphrt.models.router import route_all
from graphrt.parallel import TPGroup
from tests.support.triton_util import INTERPRET

ATOL = 1e-5
HIDDEN, REAL = 32, 4
#: Token rows of a step with ``REAL`` real: the skinny expert kernels (6 x 4 slots), the grouped (12 x 4).
ROWS = (6, 12)
CFG = SimpleNamespace(hidden_size=HIDDEN)
#: DeepSeek-V2 greedy (the fused Triton router) and V3 (sigmoid, grouped: torch), 2 and 1 pieces.
SPECS = {
    "v2-softmax": MoESpec(8, 2, 16, (True,), shared_size=32, routed_scaling_factor=1.5, router_fp32=True),
    "v3-sigmoid": MoESpec(
        8, 3, 16, (True,), scoring="sigmoid", norm_topk_prob=True, n_group=4, topk_group=2,
        routed_scaling_factor=2.5, score_bias=True, router_fp32=True, shared_size=16,
    ),
}  # fmt: skip


def _apart(spec: MoESpec) -> SparseMoE:
    """The layer with its shared expert as a dense MLP, random weights (O(1) activations)."""
    layer = SparseMoE(CFG, replace(spec, fuse_shared=False))
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in layer.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * p.shape[-1] ** -0.5)
    return layer


def _checkpoint(apart: SparseMoE) -> dict[str, torch.Tensor]:
    """The shared expert as a checkpoint holds it (``shared_experts.*_proj.weight``)."""
    gate, up = apart.shared.gate_up.weight.chunk(2, dim=0)
    return {
        "s.gate_proj.weight": gate,
        "s.up_proj.weight": up,
        "s.down_proj.weight": apart.shared.down.weight,
    }


@torch.no_grad()
def _fused(apart: SparseMoE, spec: MoESpec, tp: TPGroup = SINGLE) -> SparseMoE:
    """``apart``'s weights in the fused layout: routed experts by their loaders, the shared
    expert's pieces by its checkpoint slots (rows filled NaN first: the slots must fill them)."""
    layer = SparseMoE(CFG, spec, tp)
    layer.gate.load_state_dict(apart.gate.state_dict())
    if spec.score_bias:
        layer.score_bias.copy_(apart.score_bias)
    experts, e = layer.experts, spec.num_experts
    for name in ("w13", "w2"):
        full = torch.full(getattr(experts, name).full_shape, float("nan"))
        full[:e] = getattr(apart.experts, name)
        getattr(experts, name).weight_loader(getattr(experts, name), full)
    params = {f"m.{n}": p for n, p in layer.named_parameters()}
    tensors = _checkpoint(apart)
    for name, slot in shared_expert_slots("s", "m", spec, params).items():
        slot.load(params[slot.param], tensors[name])
    assert not any(p.isnan().any() for p in layer.parameters())
    return layer


def _ctx(spec: MoESpec, rows: int) -> SimpleNamespace:
    ids = torch.full((rows, spec.total_topk), -7, dtype=torch.int32)
    weights = torch.full((rows, spec.total_topk), -7.0)
    routing = new_routing(ids, weights, spec.total_experts)
    return SimpleNamespace(routing=routing, routing_tokens=torch.tensor([REAL], dtype=torch.int32))


@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("kernels", ["torch", "triton"])
@pytest.mark.parametrize("name", list(SPECS))
def test_fused_layer_equals_the_separate_mlp(
    name: str, kernels: str, rows: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    if kernels == "triton" and not INTERPRET:
        pytest.skip("the Triton kernels on the CPU need TRITON_INTERPRET=1")
    monkeypatch.setenv(al.ENV, "interpret" if kernels == "triton" else "0")
    spec = SPECS[name]
    apart = _apart(spec)
    fused = _fused(apart, spec)
    shared = spec.shared_size // spec.expert_size
    assert apart.shared is not None and fused.shared is None and spec.shared_slots == shared
    assert fused.experts.w13.shape == (spec.num_experts + shared, 2 * spec.expert_size, HIDDEN)
    x = torch.randn(rows, HIDDEN, generator=torch.Generator().manual_seed(1))
    x[REAL:] = float("nan")  # NOTE: pad rows' garbage must reach no real row
    want = apart(x, _ctx(apart.spec, rows))
    ctx = _ctx(spec, rows)
    got = fused(x, ctx)
    torch.testing.assert_close(got[:REAL], want[:REAL], atol=ATOL, rtol=ATOL)
    torch.testing.assert_close(fused(x[:REAL], SimpleNamespace()), want[:REAL], atol=ATOL, rtol=ATOL)
    ids, weights = ctx.routing.topk_ids, ctx.routing.topk_weights
    e, k = spec.num_experts, spec.topk
    assert (ids[:REAL, k:] == torch.arange(e, e + shared)).all() and (weights[:REAL, k:] == 1).all()
    assert (ids[:REAL, :k] < e).all()
    assert (ids[REAL:] == e + shared).all() and (weights[REAL:] == 0).all()
    assert fused.routing_shape() == RoutingShape(e + shared, k + shared)


@torch.no_grad()
@pytest.mark.parametrize("name", list(SPECS))
def test_tp_ranks_partial_sums_add_up_to_the_layer(name: str) -> None:
    """Each of two ranks holds half of every piece's columns; the partials sum to the layer."""
    spec = SPECS[name]
    apart = _apart(spec)
    x = torch.randn(REAL, HIDDEN, generator=torch.Generator().manual_seed(2))
    weights, ids = route_all(apart.gate(x), spec, apart.score_bias)
    total = torch.zeros_like(x)
    for rank in range(2):
        layer = _fused(apart, spec, TPGroup(rank=rank, size=2))
        assert layer.experts.w2.shape == (spec.total_experts, HIDDEN, spec.expert_size // 2)
        total += experts_reference(x, layer.experts.weights(), ids, weights)
    torch.testing.assert_close(total, apart(x, SimpleNamespace()), atol=ATOL, rtol=ATOL)


def test_which_specs_fuse() -> None:
    base = SPECS["v2-softmax"]
    assert base.shared_slots == 2 and (base.total_experts, base.total_topk) == (10, 4)
    kept = [
        replace(base, fuse_shared=False),
        replace(base, shared_gate=True),  # NOTE: Qwen2-MoE's gated shared expert
        replace(base, shared_size=24),  # NOTE: 16 does not divide it
        replace(base, activation="swiglu_clamp", expert_bias=True),
        replace(base, shared_size=0),
    ]
    for spec in kept:
        assert spec.shared_slots == 0 and (spec.total_experts, spec.total_topk) == (8, 2)
        layer = SparseMoE(CFG, spec)
        assert (layer.shared is not None) == (spec.shared_size > 0)
        assert layer.experts.w13.shape[0] == 8
