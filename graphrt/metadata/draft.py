"""The draft buffer group: the KV slot of every branch token at every DRAFT_DECODE step.

Host-written once per step; the draft program reads column ``i`` as step ``i``'s
``out_cache_loc`` (chains) or as the expand list of each branch (trees).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from graphrt.buffers import BufferSpec, PadRule
from graphrt.metadata.groups import GroupRow, Stateless
from graphrt.step.batch import Batch
from graphrt.step.modes import MODES


def draft_specs(steps: int) -> tuple[BufferSpec, ...]:
    """``draft_loc [max_tokens, steps]`` int64, pad rows at the dummy slot."""
    return (
        BufferSpec(
            "draft_loc", ("max_tokens", steps), torch.int64, PadRule("const", "dummy_slot"), host=True
        ),
    )


@dataclass(slots=True)
class DraftBuffers:
    """``draft_loc [T, steps]`` int64: the KV slot of each branch token at every draft step."""

    draft_loc: torch.Tensor


def write_draft_host(batch: Batch, host: dict[str, np.ndarray], tokens: int, dummy_slot: int) -> None:
    """Every row of ``[:tokens]``: the batch's slots per step, then the dummy slot."""
    loc = host["draft_loc"]
    loc[:tokens] = dummy_slot
    loc[: batch.num_tokens] = batch.out_cache_loc_steps


#: Exists when drafts run in graphs; used by DRAFT_DECODE (``MODES[mode].draft_steps``).
DRAFT_GROUP = GroupRow(
    "draft",
    lambda g, dims: draft_specs(g.spec.draft_forwards),
    lambda g: DraftBuffers,
    exists=lambda g: g.spec is not None and g.spec.draft_forwards > 0,
    used_by=lambda mode, g: MODES[mode].draft_steps,
    writer=lambda g, dims, device: Stateless(write_draft_host),
)
