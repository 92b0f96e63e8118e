"""The typed views every buffer group, program and backend share: what a step's kernels read.

Each group module (``step``, ``cascade``, ``draft``, ``local``, ``sparse``) declares its specs
and writes or derives its buffers; the dataclasses that name the fields of the step and
cascade groups live here, so a group never imports another group.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from graphrt.step.modes import ForwardMode


@dataclass(slots=True)
class CascadeBuffers:
    """``expand_table [T, width]`` int32 KV slots (page size 1), ``expand_seqlens [T]``,
    ``expand_cu_seqlens_q [T + 1]`` (``arange``: one query per expand request) and
    ``prefix_seqlens [bs]`` (keys before the tree), all int32."""

    expand_table: torch.Tensor
    expand_seqlens: torch.Tensor
    expand_cu_seqlens_q: torch.Tensor
    prefix_seqlens: torch.Tensor


@dataclass(slots=True)
class StepBuffers:
    """Per-step metadata tensors (bucket views on the graph path, fresh on the eager path).

    ``input_ids``, ``positions``, ``out_cache_loc``, ``req_id_per_token``: ``[num_tokens]``
    int64; ``req_pool_indices`` ``[bs]`` int64; ``cache_seqlens`` ``[bs]`` int32;
    ``cu_seqlens_q`` ``[bs + 1]`` int32; ``page_bound`` ``[bs]`` int32 (page-table columns the
    fused update rewrites); ``page_table`` ``[bs, max_pages]`` int32.
    """

    input_ids: torch.Tensor
    positions: torch.Tensor
    out_cache_loc: torch.Tensor
    req_id_per_token: torch.Tensor
    req_pool_indices: torch.Tensor
    cache_seqlens: torch.Tensor
    cu_seqlens_q: torch.Tensor
    page_bound: torch.Tensor
    page_table: torch.Tensor


@dataclass(frozen=True, slots=True)
class StepMetadata:
    """What the attention backends read: buffers plus host scalars (rule 4: key-derived).

    ``cascade`` is set for token trees (``topk > 1``): the backend then attends the prefix
    through ``buffers`` and each token's expand list through ``cascade``, and merges.
    """

    mode: ForwardMode
    buffers: StepBuffers
    max_seqlen_q: int
    page_size: int
    cascade: CascadeBuffers | None = None

    def host_scalars(self) -> dict[str, Any]:
        return {
            "max_seqlen_q": self.max_seqlen_q,
            "page_size": self.page_size,
            "cascade": self.cascade is not None,
        }


def token_rows(step: StepBuffers, dummy_req: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per query token row: its ``req_to_token`` row and the KV position it writes.

    Token ``t`` of request ``r`` sits at ``cache_seqlens[r] - cu_seqlens_q[r + 1] + t``. Rows
    past ``cu_seqlens_q[-1]`` (a ragged tail) map to ``dummy_req``, position 0. In place of
    any host logic: device ops only, so it runs inside a captured graph.
    """
    req = step.req_id_per_token
    token = torch.arange(req.shape[0], device=req.device)
    cu = step.cu_seqlens_q.long()
    valid = token < cu[-1]
    kv_pos = torch.where(valid, step.cache_seqlens.long()[req] - cu[req + 1] + token, 0)
    rows = torch.where(valid, step.req_pool_indices[req], dummy_req)
    return rows, kv_pos
