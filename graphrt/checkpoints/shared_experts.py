"""A shared expert fused into the routed experts' tensors: its checkpoint tensors' slots.

DeepSeek's ``shared_experts.{gate,up,down}_proj.weight`` (a dense SwiGLU of intermediate size
``S I``) land in experts ``E .. E + S - 1`` of ``w13`` / ``w2``
(:attr:`~graphrt.models.moe_config.MoESpec.shared_slots`): piece ``p`` is rows ``p I .. (p + 1) I``
of the gate and up projections and the same columns of the down projection. The SwiGLU is
elementwise over the intermediate dim, so the pieces' outputs sum to the shared expert's.

Under tensor parallelism a rank keeps, of each piece, the slice of the intermediate dim it keeps
of every routed expert (``w2.shard()``): ``S`` runs of the shared tensor, so it reads the whole
tensor (one expert's worth per piece) and cuts them out at load.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from graphrt.checkpoints.slot import Slot, Transform
from graphrt.models.moe_config import MoESpec
from graphrt.models.parallel import Shard


def _gate_up_pieces(spec: MoESpec, cols: Shard) -> Transform:
    """``[S I, H]`` → ``[S, i, H]``: this rank's rows of each piece."""

    def take(t: torch.Tensor) -> torch.Tensor:
        return t.reshape(spec.shared_slots, spec.expert_size, -1)[:, cols.start : cols.stop]

    return take


def _down_pieces(spec: MoESpec, cols: Shard) -> Transform:
    """``[H, S I]`` → ``[S, H, i]``: this rank's columns of each piece."""

    def take(t: torch.Tensor) -> torch.Tensor:
        pieces = t.reshape(t.shape[0], spec.shared_slots, spec.expert_size)[..., cols.start : cols.stop]
        return pieces.transpose(0, 1)

    return take


def shared_expert_slots(
    pre: str, mine: str, spec: MoESpec, params: Mapping[str, torch.Tensor]
) -> dict[str, Slot]:
    """The shared expert's checkpoint tensors under ``pre`` (``model.layers.{i}.mlp.shared_experts``)
    into MoE layer ``mine``'s fused expert tensors: one slot each, filling this rank's rows of
    experts ``E .. E + S - 1``; empty when the layer keeps its shared expert apart (S = 0)."""
    shared = spec.shared_slots
    if not shared:
        return {}
    w13, w2 = params[f"{mine}.experts.w13"], params[f"{mine}.experts.w2"]
    cols: Shard = w2.shard()  # type: ignore[operator]  # NOTE: this rank's intermediate slice
    hidden, inner = w2.shape[1], cols.length
    rows = slice(spec.num_experts, spec.total_experts)
    full = (spec.shared_size, hidden)
    out = {}
    for proj in ("gate", "up"):
        block: Shard = w13.shard(proj)  # type: ignore[operator]
        into = Shard(1, 0, inner, block.dest, block.size, (shared, inner, hidden))
        out[f"{pre}.{proj}_proj.weight"] = Slot(
            f"{mine}.experts.w13", into, rows, _gate_up_pieces(spec, cols), full
        )
    into = Shard(2, 0, inner, 0, cols.size, (shared, hidden, inner))
    out[f"{pre}.down_proj.weight"] = Slot(
        f"{mine}.experts.w2", into, rows, _down_pieces(spec, cols), full[::-1]
    )
    return out
