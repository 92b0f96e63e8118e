"""Mixture-of-experts MLP layers, graph-safe: router on the device, experts through the contract.

Per step the router writes ``topk_ids`` / ``topk_weights`` into the routing buffer group (its
views reach the layer as ``ctx.routing``), pad rows routed to no expert, then
:func:`~graphrt.kernels.moe.fused_experts` sums the chosen experts (fused Triton kernels on the
GPU, the torch reference on the CPU). Every MoE layer of a step reuses the same buffers in turn.
A shared expert whose size the experts' divides (DeepSeek's) is held as
:attr:`~graphrt.models.moe_config.MoESpec.shared_slots` extra experts that every real token
routes to with weight 1, so one pair of expert kernels computes routed and shared together; a
gated one (Qwen2-MoE's) or one that does not divide runs beside them as a dense MLP.

Tensor parallelism splits each expert's intermediate dim (:class:`~graphrt.models.experts.Experts`),
a fused shared expert's pieces included, and a separate shared expert's as the dense MLP's; the
router is replicated, so every rank routes the same tokens to the same experts and writes the
same routing buffers. The routed and shared partial sums meet in one all-reduce per layer.
Expert parallelism (experts placed on different ranks) is not supported (refused at config
parse, ``ep_size``).
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import torch
from torch import nn

from graphrt.kernels.moe import Routing, experts_reference, fused_experts
from graphrt.kernels.moe.align import align_reference
from graphrt.metadata.routing import RoutingShape
from graphrt.models import ops
from graphrt.models.experts import Experts
from graphrt.models.mlp import MLP
from graphrt.models.moe_config import MoESpec
from graphrt.models.parallel import SINGLE
from graphrt.models.router import route_all, route_into
from graphrt.parallel import TPGroup, all_reduce_


class Gate(ops.Linear):
    """The router linear ``[E, H]`` (with bias for gpt-oss). With ``fp32`` (DeepSeek, whose router
    transformers computes in float32) its parameters stay float32 whatever the model's dtype and
    the step multiplies ``x.float()`` by them; else it runs in the model's dtype, as transformers'
    Mixtral, Qwen-MoE, OLMoE and gpt-oss routers do (their scores then go to float32).

    ``forward(x [T, H])`` is :func:`graphrt.models.ops.linear`, as the dense projections: on the
    GPU a single row takes the skinny Triton GEMM (in the PDL chain, no cuBLAS GEMV), which widens
    a 16-bit ``x`` to float32 as it loads it (no launch converting ``x``). Returns ``[T, E]``:
    float32 with ``fp32``, else in ``x``'s dtype."""

    def __init__(self, hidden_size: int, num_experts: int, bias: bool, fp32: bool) -> None:
        super().__init__(hidden_size, num_experts, bias=bias)
        self.fp32 = fp32

    def _apply(self, fn: Any, recurse: bool = True) -> nn.Module:
        if not self.fp32:
            return super()._apply(fn, recurse)
        return super()._apply(lambda t: fn(t).float() if t.is_floating_point() else fn(t), recurse)


class SparseMoE(nn.Module):
    """One MoE MLP: ``forward(x [T, H], ctx) -> [T, H]`` in ``x``'s dtype.

    ``gate``: the router linear (:class:`Gate`); ``score_bias``: DeepSeek-V3's
    ``e_score_correction_bias [E]``; ``shared``: the shared expert as a dense SwiGLU when it is
    not fused into ``experts`` (``spec.shared_slots`` 0), ``shared_gate`` its sigmoid gate
    ``[1, H]`` (Qwen2-MoE). With ``tp``: this rank's slice of every expert's and the shared
    expert's intermediate dim, the router and its biases whole;
    ``ValueError`` naming the size and the TP size when it does not divide an intermediate size.
    """

    takes_ctx = True

    def __init__(self, cfg: Any, spec: MoESpec, tp: TPGroup = SINGLE) -> None:
        super().__init__()
        self.spec, self.tp = spec, tp
        self.gate = Gate(cfg.hidden_size, spec.num_experts, spec.router_bias, spec.router_fp32)
        self.score_bias = nn.Parameter(torch.zeros(spec.num_experts)) if spec.score_bias else None
        self.experts = Experts(spec, cfg.hidden_size, tp)
        shared = SimpleNamespace(hidden_size=cfg.hidden_size, intermediate_size=spec.shared_size)
        self.shared = MLP(shared, tp) if spec.shared_size and not spec.shared_slots else None
        self.shared_gate = ops.Linear(cfg.hidden_size, 1, bias=False) if spec.shared_gate else None

    def routing_shape(self) -> RoutingShape:
        return RoutingShape(self.spec.total_experts, self.spec.total_topk)

    def forward(self, x: torch.Tensor, ctx: Any, logits: torch.Tensor | None = None) -> torch.Tensor:
        """``logits [T, E]``: the router's output when the caller computed it (the decoder block
        fuses the norm, the router GEMM and keeping ``x`` in one launch); None: ``self.gate(x)``."""
        logits = self.gate(x) if logits is None else logits
        routing: Routing | None = getattr(ctx, "routing", None)
        if routing is None:  # NOTE: a context without routing buffers (no runtime): local tensors
            weights, ids = route_all(logits, self.spec, self.score_bias)
            out = experts_reference(x, self.experts.weights(), ids, weights)
        else:
            route_into(routing, ctx.routing_tokens, logits, self.spec, self.score_bias)
            if not x.is_cuda:  # NOTE: the fused kernels write the alignment on the GPU
                align_reference(routing.topk_ids, self.spec.total_experts, routing)
            out = fused_experts(x, self.experts.weights(), routing)
        if self.shared is not None:
            shared = self.shared.partial(x)  # NOTE: summed over the ranks with the routed experts
            if self.shared_gate is not None:
                shared = torch.sigmoid(self.shared_gate(x)) * shared
            out = out + shared
        return all_reduce_(out, self.tp)


def layer_mlp(cfg: Any, layer_id: int, tp: TPGroup = SINGLE) -> nn.Module:
    """Layer ``layer_id``'s MLP: :class:`SparseMoE` where ``cfg.moe`` says so, else the dense
    :class:`~graphrt.models.mlp.MLP` (``cfg.intermediate_size``)."""
    spec: MoESpec | None = getattr(cfg, "moe", None)
    if spec is not None and spec.is_sparse(layer_id):
        return SparseMoE(cfg, spec, tp)
    return MLP(cfg, tp)
