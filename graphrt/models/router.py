"""The MoE router on the device: scores, top-k and weights, one table row per scoring.

Every op has a static shape (top-k, gathers, masks by arithmetic): nothing reads routing on
the host, so a router runs inside a captured graph. :func:`write_routing` puts the choice into
the step's routing buffers, with pad rows (rows ``>= num_tokens``) routed to no expert.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from graphrt.kernels.moe import BLOCK_M, Routing
from graphrt.models.moe_config import MoESpec

#: ``(logits [T, E] float32, spec, score_bias [E] or None) -> (weights [T, k] float32, ids [T, k] int64)``.
Scorer = Callable[[torch.Tensor, MoESpec, torch.Tensor | None], tuple[torch.Tensor, torch.Tensor]]


def _group_mask(
    scores: torch.Tensor, spec: MoESpec, group_score: Callable[[torch.Tensor], torch.Tensor]
) -> torch.Tensor:
    """``[T, E]`` bool: experts in the ``topk_group`` best of ``n_group`` groups (by ``group_score``)."""
    t, e = scores.shape
    groups = group_score(scores.view(t, spec.n_group, e // spec.n_group))
    chosen = torch.topk(groups, spec.topk_group, dim=-1, sorted=False)[1]
    mask = torch.zeros_like(groups).scatter_(1, chosen, 1.0)
    return mask.bool()[:, :, None].expand(t, spec.n_group, e // spec.n_group).reshape(t, e)


def _renorm(weights: torch.Tensor, spec: MoESpec, eps: float = 0.0) -> torch.Tensor:
    if spec.norm_topk_prob:
        weights = weights / (weights.sum(dim=-1, keepdim=True) + eps)
    return weights * spec.routed_scaling_factor


def softmax_topk(
    logits: torch.Tensor, spec: MoESpec, bias: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Mixtral / Qwen-MoE / OLMoE / DeepSeek-V2 ``greedy``: softmax, top-k, optional renorm."""
    weights, ids = torch.topk(logits.softmax(dim=-1), spec.topk, dim=-1)
    return _renorm(weights, spec), ids


def group_limited(
    logits: torch.Tensor, spec: MoESpec, bias: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """DeepSeek-V2 ``group_limited_greedy``: softmax; groups ranked by their best expert."""
    scores = logits.softmax(dim=-1)
    scores = scores.masked_fill(~_group_mask(scores, spec, lambda g: g.amax(dim=-1)), 0.0)
    weights, ids = torch.topk(scores, spec.topk, dim=-1)
    return _renorm(weights, spec), ids


def sigmoid_grouped(
    logits: torch.Tensor, spec: MoESpec, bias: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """DeepSeek-V3 ``noaux_tc``: sigmoid scores; the choice adds ``e_score_correction_bias`` and
    ranks groups by their two best; the weights are the unbiased scores."""
    scores = logits.sigmoid()
    choice = scores if bias is None else scores + bias.float()
    mask = _group_mask(choice, spec, lambda g: g.topk(min(2, g.shape[-1]), dim=-1)[0].sum(dim=-1))
    ids = torch.topk(choice.masked_fill(~mask, float("-inf")), spec.topk, dim=-1)[1]
    return _renorm(scores.gather(1, ids), spec, eps=1e-20), ids


def topk_softmax(
    logits: torch.Tensor, spec: MoESpec, bias: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """gpt-oss: top-k of the logits, softmax over the chosen."""
    values, ids = torch.topk(logits, spec.topk, dim=-1)
    return values.softmax(dim=-1), ids


SCORERS: dict[str, Scorer] = {
    "softmax": softmax_topk,
    "group_limited": group_limited,
    "sigmoid": sigmoid_grouped,
    "topk_softmax": topk_softmax,
}


def route(
    logits: torch.Tensor, spec: MoESpec, bias: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(weights [T, k] float32, ids [T, k] int64)`` of router ``logits [T, E]`` (any float dtype)."""
    return SCORERS[spec.scoring](logits.float(), spec, bias)


def write_routing(
    routing: Routing, num_tokens: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor
) -> None:
    """Copy the choice into ``routing`` in place; rows ``>= num_tokens [1]`` (pad rows) get the
    id ``num_experts`` ("no expert") and weight 0, so they read no expert weights."""
    num_experts = routing.expert_counts.shape[0]
    pad = (torch.arange(ids.shape[0], device=ids.device) >= num_tokens.to(ids.device))[:, None]
    routing.topk_ids.copy_(torch.where(pad, num_experts, ids))
    routing.topk_weights.copy_(torch.where(pad, 0.0, weights))


def align_reference(routing: Routing) -> None:
    """The alignment buffers of ``routing`` from its ``topk_ids``, in torch (sync-free): the CPU
    path's counterpart of the alignment kernel, same layout (:class:`Routing`).

    Slots ``t * k + j`` grouped by expert in slot order, each expert's run padded to
    :data:`BLOCK_M` with the tail value ``T * k``; ``block_experts`` -1 past ``num_padded``.
    """
    ids = routing.topk_ids.reshape(-1).long()
    slots, num_experts = ids.numel(), routing.expert_counts.shape[0]
    counts = torch.zeros(num_experts + 1, dtype=torch.long, device=ids.device)
    counts.scatter_add_(0, ids, torch.ones_like(ids))
    routing.expert_counts.copy_(counts[:num_experts])
    padded = (counts[:num_experts] + BLOCK_M - 1) // BLOCK_M * BLOCK_M
    ends = padded.cumsum(0)
    order = torch.sort(ids, stable=True)[1]
    expert = ids[order]
    rank = torch.arange(slots, device=ids.device) - (counts.cumsum(0) - counts)[expert]
    size = routing.sorted_ids.shape[0]
    start = (ends - padded)[expert.clamp(max=num_experts - 1)]
    pos = torch.where(expert < num_experts, start + rank, size)
    out = torch.full((size + 1,), slots, dtype=torch.long, device=ids.device)
    routing.sorted_ids.copy_(out.scatter_(0, pos, order)[:size])
    routing.num_padded.copy_(ends[-1:])
    first = torch.arange(routing.block_experts.shape[0], device=ids.device) * BLOCK_M
    block = torch.searchsorted(ends, first, right=True)
    routing.block_experts.copy_(torch.where(first < ends[-1], block, -1))
