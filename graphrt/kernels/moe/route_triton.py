"""The softmax routers as one Triton program per token row (:func:`route_triton`).

One program reads its row of router logits, scores it (a softmax over all experts, or none for
gpt-oss's top-k-then-softmax), picks the top ``k`` by repeated arg-max (ties to the lower
expert id, as a stable sort would) and writes the choice straight into the routing buffers:
ids and weights, renormalised and scaled as the spec says. A pad row (``t >= num_tokens``)
gets ``k`` distinct lanes too, written as the id ``E`` and weight 0, so its poisoned logits
never reach a buffer. With ``shared`` fused shared experts (:attr:`graphrt.models.moe_config.
MoESpec.shared_slots`) each row's last ``shared`` slots get the ids ``E .. E + shared - 1`` and
weight 1 (a pad row's: ``E + shared`` and 0). It replaces a dozen small launches per MoE layer
(scores, top-k, sums, the pad mask and two copies) with one.
"""

from __future__ import annotations

import torch

from graphrt.kernels.switches import tl, triton

#: Scorings this kernel computes (:data:`graphrt.models.moe_config.SCORINGS`); the grouped ones
#: (DeepSeek's) run in torch.
FUSED_SCORINGS = ("softmax", "topk_softmax")


def route_triton(
    logits: torch.Tensor,
    num_tokens: torch.Tensor,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    scoring: str,
    renorm: bool,
    scale: float,
    pdl: bool,
    shared: int = 0,
) -> None:
    """Write the top-k choice of ``logits [T, E]`` (any float dtype) into ``topk_ids [T, k + shared]``
    int32 and ``topk_weights [T, k + shared]`` float32, the ``shared`` fused shared experts last;
    rows ``>= num_tokens [1]`` (int) are pad rows."""
    assert triton is not None, "the fused router needs Triton"
    tokens, experts = logits.shape
    topk = topk_ids.shape[1] - shared
    if not 1 <= topk <= experts or shared < 0:
        raise ValueError(f"topk_ids {tuple(topk_ids.shape)} holds {topk} routed slots of {experts} experts")
    _route[(tokens,)](
        logits, num_tokens, topk_ids, topk_weights, experts, logits.stride(0), float(scale),
        TOPK=topk, SHARED=shared, BS=triton.next_power_of_2(max(shared, 1)),
        BE=triton.next_power_of_2(experts), SOFTMAX_FIRST=scoring == "softmax", RENORM=renorm,
        PDL=pdl, num_warps=1, launch_pdl=pdl,
    )  # fmt: skip


if triton is not None:

    @triton.jit
    def _route(
        logits, num_tokens, ids_out, weights_out, E, stride, scale,
        TOPK: tl.constexpr, SHARED: tl.constexpr, BS: tl.constexpr, BE: tl.constexpr,
        SOFTMAX_FIRST: tl.constexpr, RENORM: tl.constexpr, PDL: tl.constexpr,
    ):  # fmt: skip
        t = tl.program_id(0)
        re = tl.arange(0, BE)
        lane = re < E
        if PDL:
            tl.extra.cuda.gdc_wait()  # NOTE: the logits are the router GEMM's output
            tl.extra.cuda.gdc_launch_dependents()
        real = t < tl.load(num_tokens)
        x = tl.load(logits + t * stride + re, mask=lane, other=0.0).to(tl.float32)
        x = tl.where(lane & real, x, float("-inf"))
        x = tl.where(lane & ~real, 0.0, x)  # NOTE: a pad row ranks its lanes 0, 1, ... (ties)
        if SOFTMAX_FIRST:
            e = tl.exp(x - tl.max(x, 0))
            x = tl.where(lane, e / tl.sum(e, 0), float("-inf"))
        rank = tl.full((BE,), -1, tl.int32)
        remaining = x
        for j in tl.static_range(TOPK):
            best = tl.max(remaining, 0)
            pick = tl.min(tl.where(remaining == best, re, BE), 0)
            rank = tl.where(re == pick, j, rank)
            remaining = tl.where(re == pick, float("-inf"), remaining)
        chosen = rank >= 0
        if SOFTMAX_FIRST:
            w = x
            if RENORM:
                w = w / tl.sum(tl.where(chosen, x, 0.0), 0)
        else:  # NOTE: gpt-oss: the softmax over the chosen logits only
            e = tl.where(chosen, tl.exp(x - tl.max(x, 0)), 0.0)
            w = e / tl.sum(e, 0)
        row = t * (TOPK + SHARED)
        none = E + SHARED  # NOTE: the id past every expert tensor's row, routed or shared
        tl.store(ids_out + row + rank, tl.where(real, re, none), mask=chosen)
        tl.store(weights_out + row + rank, tl.where(real, w * scale, 0.0), mask=chosen)
        if SHARED > 0:  # NOTE: unscaled: DeepSeek adds the shared expert's output as it is
            rs = tl.arange(0, BS)
            own = rs < SHARED
            tl.store(ids_out + row + TOPK + rs, tl.where(real, E + rs, none), mask=own)
            tl.store(weights_out + row + TOPK + rs, tl.where(real, 1.0, 0.0), mask=own)
