"""Sparse MLA through ``sgl_kernel.flash_mla`` (FlashMLA, SM90/SM100).

* BF16 cache: ``flash_mla_sparse_fwd(q [T, H, 576], kv [slots, 1, 576], indices [T, 1, topk])``.
* FP8 cache (656 bytes/token): ``flash_mla_with_kvcache(..., is_fp8_kvcache=True, indices=...)``
  with ``q [b, s_q, H, 576]`` and ``indices [b, s_q, topk]``.

Heads are padded to 64 or 128 in the static ``q_pad`` scratch (its padding heads are zero and
never written) and unpadded on the way out. The FP8 tile schedule is planned once per step by
``plan`` — inside the graph on the graph path — into the static ``sched_meta`` / ``num_splits``
buffers (``api="static"``), or inside the first layer's kernel (``api="schedmeta"``, the newer
``FlashMLASchedMeta`` API, whose buffers then live in the graph's private pool).
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from typing import Any

import torch

from graphrt.attention.base import Backend, BufferGroup
from graphrt.attention.call import AttendCall
from graphrt.attention.capabilities import REQUEST_MODES, GraphSupport
from graphrt.kv.mla import KV_LORA_RANK, QK_DIM
from graphrt.metadata.sparse import SparseBuffers, sparse_specs
from graphrt.step.modes import MODES

HEAD_CHOICES = (64, 128)
# NOTE: SM90 sparse prefill asserts topk % 128 == 0 (2 x B_TOPK); sparse decode needs 64.
TOPK_MULTIPLE = 128


def flashmla_available(device: torch.device, layout: str, **_: Any) -> bool:
    # NOTE: FlashMLA reads bf16 or its FP8 656-byte rows; an fp32 cache runs the reference.
    if (
        layout not in ("bf16", "fp8")
        or device.type != "cuda"
        or importlib.util.find_spec("sgl_kernel") is None
    ):
        return False
    if torch.cuda.get_device_capability(device)[0] not in (9, 10):
        return False
    try:
        from sgl_kernel import flash_mla

        return flash_mla._flashmla_import_error is None
    except (ImportError, OSError, RuntimeError):
        return False


@dataclass(frozen=True, slots=True)
class FP8Plan:
    """What every layer of one step passes to ``flash_mla_with_kvcache`` (FP8 only)."""

    b: int
    s_q: int
    sched: Any  # [parts, 8] int32 view of sched_meta, or a FlashMLASchedMeta
    num_splits: torch.Tensor | None
    seqlens: torch.Tensor | None
    block_table: torch.Tensor | None


class FlashMLABackend(Backend):
    """FlashMLA sparse attention; ``padded_heads`` defaults to 64 (or 128 above 64 heads)."""

    slot_multiple = TOPK_MULTIPLE
    graph_support = GraphSupport(REQUEST_MODES, trees=True, fp8_kv=True)

    def __init__(
        self,
        num_heads: int,
        layout: str,
        index_topk: int,
        *,
        padded_heads: int | None = None,
        api: str = "static",
    ) -> None:
        from sgl_kernel import flash_mla

        self.padded_heads = padded_heads or (64 if num_heads <= 64 else 128)
        if self.padded_heads not in HEAD_CHOICES or num_heads > self.padded_heads:
            raise ValueError(
                f"FlashMLA runs {HEAD_CHOICES} heads; cannot pad {num_heads} to {self.padded_heads}"
            )
        if api not in ("static", "schedmeta"):
            raise ValueError(f"api must be 'static' or 'schedmeta', got {api!r}")
        self.num_heads, self.layout, self.api, self._mla = num_heads, layout, api, flash_mla
        self.index_topk = index_topk
        self.name = "flashmla" if api == "static" else "flashmla-schedmeta"

    @classmethod
    def available(cls, device: torch.device, layout: str = "bf16", **_: Any) -> bool:
        return flashmla_available(device, layout)

    def buffers(self) -> BufferGroup:
        return BufferGroup(
            sparse_specs(self.index_topk, self.padded_heads, self.slot_multiple), SparseBuffers
        )

    def plan(self, call: AttendCall) -> FP8Plan | None:
        """FP8: the step's tile schedule. Uniform modes use ``[bs, q_len]`` rows (static
        buffers); ragged ones (EXTEND, DRAFT_EXTEND) one row per token, on fresh tensors (the
        graph's pool when graphed)."""
        if self.layout == "bf16":
            return None
        meta, sparse = call.meta, call.group
        step, topk, hp = meta.buffers, sparse.topk_slots.shape[1], self.padded_heads
        tokens = step.req_id_per_token.shape[0]
        ragged = MODES[meta.mode].ragged
        b, s_q = (tokens, 1) if ragged else (step.cache_seqlens.shape[0], meta.max_seqlen_q)
        if self.api == "schedmeta":
            return FP8Plan(b, s_q, self._mla.get_mla_metadata()[0], None, None, None)
        if ragged:
            seqlens = torch.full((b,), topk, dtype=torch.int32, device=step.cache_seqlens.device)
            table = torch.zeros(b, 1, dtype=torch.int32, device=seqlens.device)
        else:
            seqlens, table = step.cache_seqlens, step.page_table
        sched, splits = self._mla.get_mla_metadata(seqlens, s_q * hp, 1, hp, True, topk)
        if ragged:
            return FP8Plan(b, s_q, sched, splits, seqlens, table)
        parts = sched.shape[0]
        assert parts <= sparse.sched_meta.shape[0], f"{parts} scheduler parts > static buffer"
        # NOTE: planned into the static buffers inside the graph, so every replay re-plans
        # in place and all layers read the same addresses.
        sparse.sched_meta[:parts].copy_(sched)
        sparse.num_splits[: b + 1].copy_(splits)
        return FP8Plan(b, s_q, sparse.sched_meta[:parts], sparse.num_splits[: b + 1], seqlens, table)

    def forward(self, call: AttendCall) -> torch.Tensor:
        q, sparse, plan, scale = call.q, call.group, call.plan, call.scale
        tokens, heads, _ = q.shape
        hp, topk = self.padded_heads, sparse.topk_slots.shape[1]
        if topk % TOPK_MULTIPLE:
            raise ValueError(f"FlashMLA needs topk_slots width % {TOPK_MULTIPLE} == 0, got {topk}")
        q_pad = sparse.q_pad[:tokens]
        q_pad[:, :heads].copy_(q)
        slots = sparse.topk_slots[:tokens]
        if plan is None:
            kv = call.k_cache.view(-1, 1, QK_DIM)
            out = self._mla.flash_mla_sparse_fwd(q_pad, kv, slots.unsqueeze(1), scale, KV_LORA_RANK)[0]
        else:
            out, _ = self._mla.flash_mla_with_kvcache(
                q_pad.view(plan.b, plan.s_q, hp, QK_DIM),
                call.k_cache.view(torch.float8_e4m3fn),
                plan.block_table,
                plan.seqlens,
                KV_LORA_RANK,
                plan.sched,
                plan.num_splits,
                softmax_scale=scale,
                is_fp8_kvcache=True,
                indices=slots.view(plan.b, plan.s_q, topk),
            )
        return out.reshape(tokens, hp, KV_LORA_RANK)[:, :heads].to(q.dtype)

    def host_scalars(self) -> dict[str, Any]:
        return {
            "flashmla.padded_heads": self.padded_heads,
            "flashmla.api": self.api,
            "flashmla.layout": self.layout,
        }


class FlashMLASchedMetaBackend(FlashMLABackend):
    """FlashMLA with the newer ``FlashMLASchedMeta`` API (schedule planned in the first layer)."""

    def __init__(self, num_heads: int, layout: str, index_topk: int) -> None:
        super().__init__(num_heads, layout, index_topk, api="schedmeta")
