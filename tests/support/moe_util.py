"""Random MoE layers and routings for the expert kernel tests and ``graphrt bench moe``'s checks."""

from __future__ import annotations

import torch

from graphrt.kernels.moe import ExpertWeights, Routing, new_routing


def random_experts(
    num_experts: int, hidden: int, inter: int, *, bias: bool, activation: str, dtype, device, seed: int = 0
) -> ExpertWeights:
    """Weights scaled so activations stay O(1) (``H ** -0.5``, ``I ** -0.5``)."""
    gen = torch.Generator().manual_seed(seed)

    def rand(*shape: int, scale: float = 1.0) -> torch.Tensor:
        return (torch.randn(shape, generator=gen) * scale).to(device, dtype)

    return ExpertWeights(
        rand(num_experts, 2 * inter, hidden, scale=hidden**-0.5),
        rand(num_experts, hidden, inter, scale=inter**-0.5),
        rand(num_experts, 2 * inter, scale=0.5) if bias else None,
        rand(num_experts, hidden, scale=0.5) if bias else None,
        activation,
    )


def random_ids(
    tokens: int, topk: int, num_experts: int, *, pad_rows: tuple[int, ...] = (), seed: int = 0
) -> torch.Tensor:
    """``[T, k]`` int32: ``k`` distinct experts per row; rows in ``pad_rows`` all ``num_experts``."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.stack([torch.randperm(num_experts, generator=gen)[:topk] for _ in range(tokens)]).int()
    ids[list(pad_rows)] = num_experts
    return ids


def random_routing(
    tokens: int, topk: int, num_experts: int, device, *, pad_rows: tuple[int, ...] = (), seed: int = 0
) -> Routing:
    """A routing with fresh (zeroed) alignment buffers; weights in (0, 1), NaN on pad rows (poison
    that must never reach the output)."""
    gen = torch.Generator().manual_seed(seed + 1)
    weights = torch.rand(tokens, topk, generator=gen)
    weights[list(pad_rows)] = float("nan")
    ids = random_ids(tokens, topk, num_experts, pad_rows=pad_rows, seed=seed)
    return new_routing(ids.to(device), weights.to(device), num_experts)
