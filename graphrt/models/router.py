"""The MoE router on the device: scores, top-k and weights, one table row per scoring.

Every op has a static shape (top-k, gathers, masks by arithmetic): nothing reads routing on
the host, so a router runs inside a captured graph. :func:`route_into` puts the choice into the
step's routing buffers, with pad rows (rows ``>= num_tokens``) routed to no expert: one fused
Triton program for the softmax scorings where Triton runs, else these torch ops. A shared
expert held as extra experts (:attr:`~graphrt.models.moe_config.MoESpec.shared_slots`) takes the
last ``S`` slots of every real row, weight 1.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from graphrt.kernels.moe import Routing
from graphrt.kernels.moe.align import ENV, PDL_ENV
from graphrt.kernels.moe.route_triton import FUSED_SCORINGS, route_triton
from graphrt.kernels.switches import pdl_enabled, triton_enabled
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
    return values.float().softmax(dim=-1), ids


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
    scores = logits if spec.scoring == "topk_softmax" else logits.float()  # NOTE: ranked as computed
    return SCORERS[spec.scoring](scores, spec, bias)


def with_shared(weights: torch.Tensor, ids: torch.Tensor, spec: MoESpec) -> tuple[torch.Tensor, torch.Tensor]:
    """The routed choice ``[T, k]`` with the fused shared experts' :attr:`~MoESpec.shared_slots`
    appended: ``[T, k + S]``, ids ``num_experts .. num_experts + S - 1`` with weight 1 (unscaled:
    DeepSeek adds the shared expert's output as it is). Unchanged when ``S`` is 0."""
    shared = spec.shared_slots
    if not shared:
        return weights, ids
    rows = ids.shape[0]
    extra = torch.arange(spec.num_experts, spec.total_experts, dtype=ids.dtype, device=ids.device)
    ones = torch.ones(rows, shared, dtype=weights.dtype, device=weights.device)
    return torch.cat((weights, ones), dim=1), torch.cat((ids, extra.expand(rows, shared)), dim=1)


def route_all(
    logits: torch.Tensor, spec: MoESpec, bias: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`route` then :func:`with_shared`: every slot a token reads, ``[T, k + S]``."""
    return with_shared(*route(logits, spec, bias), spec)


def write_routing(
    routing: Routing, num_tokens: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor
) -> None:
    """Copy the choice into ``routing`` in place; rows ``>= num_tokens [1]`` (pad rows) get the
    id ``num_experts`` of the buffers (every expert tensor's row count, fused shared experts
    included: "no expert") and weight 0, so they read no expert weights."""
    num_experts = routing.expert_counts.shape[0]
    pad = (torch.arange(ids.shape[0], device=ids.device) >= num_tokens.to(ids.device))[:, None]
    routing.topk_ids.copy_(torch.where(pad, num_experts, ids))
    routing.topk_weights.copy_(torch.where(pad, 0.0, weights))


def route_into(
    routing: Routing,
    num_tokens: torch.Tensor,
    logits: torch.Tensor,
    spec: MoESpec,
    bias: torch.Tensor | None = None,
) -> None:
    """Route ``logits [T, E]`` into ``routing``'s ``topk_ids`` / ``topk_weights`` ``[T, k + S]``
    in place (the fused shared experts' slots last), rows ``>= num_tokens [1]`` as pad rows:
    :func:`route_all` and :func:`write_routing`, or the fused kernel
    (:mod:`graphrt.kernels.moe.route_triton`) where it runs (the MoE switch)."""
    if spec.scoring in FUSED_SCORINGS and triton_enabled(ENV, logits.device):
        pdl = pdl_enabled(PDL_ENV, logits.device)
        renorm, scale = spec.norm_topk_prob, spec.routed_scaling_factor
        ids, weights = routing.topk_ids, routing.topk_weights
        route_triton(logits, num_tokens, ids, weights, spec.scoring, renorm, scale, pdl, spec.shared_slots)
        return
    weights, ids = route_all(logits, spec, bias)
    write_routing(routing, num_tokens, weights, ids)
