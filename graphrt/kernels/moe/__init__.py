"""Mixture-of-experts kernels: routed tokens through their experts' weights, graph-safe.

The contract the models call (:func:`fused_experts`) and its torch reference
(:func:`experts_reference`, the CPU path and the oracle of the Triton kernels). Routing is
device data (DESIGN rule 10): ``topk_ids`` / ``topk_weights`` live in the routing buffer group,
sized for the largest bucket; a pad row's ids are ``num_experts`` ("no expert"), so it reads no
expert weights and adds nothing. Nothing here reads routing on the host.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from graphrt.kernels.moe.align import BLOCK_M, align_bound, block_bound, moe_align

#: gpt-oss's clamped SwiGLU: ``(up + 1) * gate * sigmoid(ALPHA * gate)``, gate clamped above at
#: LIMIT and up to ``[-LIMIT, LIMIT]``.
SWIGLU_ALPHA, SWIGLU_LIMIT = 1.702, 7.0
ACTIVATIONS = ("silu", "swiglu_clamp")


@dataclass(frozen=True, slots=True)
class ExpertWeights:
    """One MoE layer's routed experts (this rank's shard of each expert's intermediate dim).

    ``w13 [E, 2 I, H]``: gate rows then up rows; ``w2 [E, H, I]``; optional biases ``b13 [E, 2 I]``
    and ``b2 [E, H]`` (gpt-oss); ``activation``: one of :data:`ACTIVATIONS`.
    """

    w13: torch.Tensor
    w2: torch.Tensor
    b13: torch.Tensor | None = None
    b2: torch.Tensor | None = None
    activation: str = "silu"

    @property
    def num_experts(self) -> int:
        return self.w13.shape[0]


@dataclass(slots=True)
class Routing:
    """Views of the routing buffer group for this step's ``T`` token rows (``k`` = top-k).

    ``topk_ids [T, k]`` int32 (``num_experts`` on pad rows), ``topk_weights [T, k]`` float32,
    written by the router inside the graph; ``sorted_ids [align_bound(T, k, E)]`` int32 (token
    slot ``t * k + j`` grouped by expert, each expert's run padded to :data:`BLOCK_M`, the tail
    ``T * k``), ``block_experts [block_bound(T, k, E)]`` int32 (each block's expert, -1 past the
    end), ``num_padded [1]`` int32 (the true length of ``sorted_ids``) and ``expert_counts
    [E]`` int32, written by the alignment kernel.
    """

    topk_ids: torch.Tensor
    topk_weights: torch.Tensor
    sorted_ids: torch.Tensor
    block_experts: torch.Tensor
    num_padded: torch.Tensor
    expert_counts: torch.Tensor


def new_routing(topk_ids: torch.Tensor, topk_weights: torch.Tensor, num_experts: int) -> Routing:
    """A :class:`Routing` over these ``[T, k]`` tensors with fresh alignment buffers at their bounds
    (benches and tests; a runtime takes views of its routing buffer group instead)."""
    tokens, topk = topk_ids.shape

    def vector(n: int) -> torch.Tensor:
        return torch.zeros(n, dtype=torch.int32, device=topk_ids.device)

    return Routing(
        topk_ids,
        topk_weights,
        vector(align_bound(tokens, topk, num_experts)),
        vector(block_bound(tokens, topk, num_experts)),
        vector(1),
        vector(num_experts),
    )


def activate(gate_up: torch.Tensor, activation: str) -> torch.Tensor:
    """``[..., 2 I] -> [..., I]``: SiLU(gate) * up, or gpt-oss's clamped SwiGLU."""
    gate, up = gate_up.chunk(2, dim=-1)
    if activation == "silu":
        return torch.nn.functional.silu(gate) * up
    gate, up = gate.clamp(max=SWIGLU_LIMIT), up.clamp(-SWIGLU_LIMIT, SWIGLU_LIMIT)
    return (up + 1) * gate * torch.sigmoid(gate * SWIGLU_ALPHA)


def experts_reference(
    x: torch.Tensor, w: ExpertWeights, ids: torch.Tensor, weights: torch.Tensor
) -> torch.Tensor:
    """``sum_j weights[t, j] * expert_{ids[t, j]}(x[t])``: ``x [T, H]`` → ``[T, H]`` in ``x``'s dtype.

    Static shapes only (a gather per top-k slot): runs inside a captured or emulated graph. An
    id of ``num_experts`` (a pad row) contributes zero.
    """
    num_experts = w.num_experts
    valid = ids < num_experts
    safe = torch.where(valid, ids, 0).long()
    out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    for j in range(ids.shape[1]):
        e = safe[:, j]
        h = torch.einsum("th,tnh->tn", x.float(), w.w13[e].float())
        if w.b13 is not None:
            h = h + w.b13[e].float()
        h = torch.einsum("tn,thn->th", activate(h, w.activation), w.w2[e].float())
        if w.b2 is not None:
            h = h + w.b2[e].float()
        # NOTE: where, not a zero scale: a pad row's garbage (NaN poison) must not reach the sum
        out += torch.where(valid[:, j, None], weights[:, j, None].float() * h, 0.0)
    return out.to(x.dtype)


def fused_experts(x: torch.Tensor, w: ExpertWeights, routing: Routing) -> torch.Tensor:
    """The routed experts' weighted sum for ``x [T, H]`` (``routing`` written for this step).

    The fused Triton kernels where they run (:mod:`graphrt.kernels.moe.triton_experts`), else
    :func:`experts_reference`. Without the Triton path, ``routing``'s alignment buffers are
    left as they were (the reference reads ``topk_ids`` / ``topk_weights`` only); the grouped
    Triton path writes them (:func:`graphrt.kernels.moe.align.moe_align`), the skinny one (``T * k``
    up to ``triton_experts.max_skinny_slots()``) does not need them.
    """
    from graphrt.kernels.moe import triton_experts  # NOTE: it imports this module's types

    if triton_experts.enabled(x.device):
        return triton_experts.fused_experts_triton(x, w, routing)
    return experts_reference(x, w, routing.topk_ids, routing.topk_weights)


__all__ = [
    "ACTIVATIONS",
    "BLOCK_M",
    "ExpertWeights",
    "Routing",
    "activate",
    "align_bound",
    "block_bound",
    "experts_reference",
    "fused_experts",
    "moe_align",
    "new_routing",
]
