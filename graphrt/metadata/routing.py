"""The routing buffer group: where MoE layers put each step's expert choice (DESIGN rule 10).

Routing is device data, sized for the largest bucket like every other per-step tensor:

- ``num_tokens [1]`` int32, host-written: the step's real token rows; rows ``>= num_tokens``
  are pad rows, which the router sends to no expert (id ``num_experts``, weight 0).
- ``topk_ids [T, k]`` int32 and ``topk_weights [T, k]`` float32, written by the router of each
  MoE layer inside the graph (pad rules: ``num_experts`` and 0).
- ``sorted_ids [align_bound]``, ``block_experts [block_bound]``, ``num_padded [1]``,
  ``expert_counts [E]`` int32: the alignment of the slots by expert
  (:mod:`graphrt.kernels.moe.align`), sized for the largest bucket's tokens: the grouped GEMMs'
  workspace (``scratch``: steps of few slots take the skinny kernels, which read ``topk_ids``
  directly and leave it unwritten; the CPU path writes it every step).

Every MoE layer of a step reuses the buffers in turn. The group exists when the model has MoE
layers (``Geometry.routing``) and every mode that runs the model forward uses it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from graphrt.buffers import BufferSpec, Dims, PadRule, StaticBuffers
from graphrt.kernels.moe import Routing, align_bound, block_bound
from graphrt.metadata.groups import Geometry, GroupRow
from graphrt.step.batch import Batch


@dataclass(frozen=True, slots=True)
class RoutingShape:
    """A model's routing: ``num_experts`` experts, ``topk`` slots per token (the same in every
    MoE layer); both count a shared expert held as ``S`` extra experts (``MoESpec.total_experts``,
    ``total_topk``), so pad rows get the id past it too."""

    num_experts: int
    topk: int


def routing_specs(shape: RoutingShape, dims: Dims) -> tuple[BufferSpec, ...]:
    """The group's buffers for an allocation of ``dims.max_tokens`` token rows."""
    e, k, tokens = shape.num_experts, shape.topk, dims.max_tokens
    free = PadRule("free")
    return (
        BufferSpec("num_tokens", (1,), torch.int32, free, host=True),
        BufferSpec("topk_ids", ("max_tokens", k), torch.int32, PadRule("const", e)),
        BufferSpec("topk_weights", ("max_tokens", k), torch.float32, PadRule("const", 0)),
        BufferSpec("sorted_ids", (align_bound(tokens, k, e),), torch.int32, free, scratch=True),
        BufferSpec("block_experts", (block_bound(tokens, k, e),), torch.int32, free, scratch=True),
        BufferSpec("num_padded", (1,), torch.int32, free, scratch=True),
        BufferSpec("expert_counts", (e,), torch.int32, free, scratch=True),
    )


@dataclass(slots=True)
class RoutingBuffers:
    """The group's views: see the module docstring for each buffer's shape and meaning."""

    num_tokens: torch.Tensor
    topk_ids: torch.Tensor
    topk_weights: torch.Tensor
    sorted_ids: torch.Tensor
    block_experts: torch.Tensor
    num_padded: torch.Tensor
    expert_counts: torch.Tensor

    def routing(self, tokens: int) -> Routing:
        """The contract's :class:`~graphrt.kernels.moe.Routing` for a forward of ``tokens`` rows."""
        e, k = self.expert_counts.shape[0], self.topk_ids.shape[1]
        return Routing(
            self.topk_ids[:tokens],
            self.topk_weights[:tokens],
            self.sorted_ids[: align_bound(tokens, k, e)],
            self.block_experts[: block_bound(tokens, k, e)],
            self.num_padded,
            self.expert_counts,
        )


class RoutingWriter:
    """Writes the step's count of real token rows (the only host-written routing buffer)."""

    def write(self, group: StaticBuffers, batch: Batch, rows: int, tokens: int, pad: dict[str, int]) -> bool:
        group.next_mirror()["num_tokens"][0] = batch.num_tokens
        return True

    def forget(self) -> None:
        return None


def _specs(g: Geometry, dims: Dims) -> tuple[BufferSpec, ...]:
    assert g.routing is not None
    return routing_specs(g.routing, dims)


#: Exists for a model with MoE layers; every mode runs the model, so every mode uses it.
ROUTING_GROUP = GroupRow(
    "routing",
    _specs,
    lambda g: RoutingBuffers,
    exists=lambda g: g.routing is not None,
    used_by=lambda mode, g: True,
    writer=lambda g, dims, device: RoutingWriter(),
)
