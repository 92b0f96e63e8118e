"""FA3 through ``sgl_kernel.flash_attn.flash_attn_with_kvcache`` (Hopper, paged KV).

The backend owns one buffer, ``scheduler_metadata``: FA3's tile schedule for the step, planned
once per forward (inside the graph) by ``get_scheduler_metadata`` and read by every layer, in
place of the ``prepare_varlen_num_blocks`` kernel FA3 otherwise runs before each layer. The
plan uses what every layer's call uses, all functions of the graph key: ``max_seqlen_k`` is the
page table's width (what ``flash_attn_with_kvcache`` derives itself), ``num_splits`` the
backend's (``GRAPHRT_FA3_NUM_SPLITS``, default 0: FA3's heuristic). Layers with a sliding
window, token trees (cascade) and chunked-local layers keep FA3's own per-call schedule.
``GRAPHRT_FA3_PLAN=0`` turns the plan off. ``qv`` (dense MLA's absorbed ``q_nope``, scored
against the values; :mod:`graphrt.attention.fa3_mla`) passes through to every call.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from typing import Any

import torch

from graphrt.attention.base import Backend, BufferGroup
from graphrt.buffers import BufferSpec, PadRule
from graphrt.metadata.base import StepMetadata

#: KV/query dtypes the FA3 kernel takes (it refuses fp32 at launch).
FA3_DTYPES = (torch.bfloat16, torch.float16)
#: FA3's schedule for ``b`` requests holds at most ``4 * round_up(b, 4) + 1`` int32 (split
#: counts, m-blocks, batch order, heads in L2, tile semaphore); ``4 * b + 16`` covers it.
SCHEDULER_SPECS = (BufferSpec("scheduler_metadata", ("4*max_bs+16",), torch.int32, PadRule("free")),)


@dataclass(slots=True)
class FA3Buffers:
    """``scheduler_metadata [4 * bs + 16]`` int32: FA3's tile schedule of the step (its head)."""

    scheduler_metadata: torch.Tensor


def fa3_available(device: torch.device, dtype: torch.dtype | None = None) -> bool:
    """FA3 runs on ``device`` (Hopper, sgl_kernel importable) for a ``dtype`` KV cache."""
    if dtype is not None and dtype not in FA3_DTYPES:
        return False
    if device.type != "cuda" or importlib.util.find_spec("sgl_kernel") is None:
        return False
    try:
        from sgl_kernel.flash_attn import is_fa3_supported

        return bool(is_fa3_supported(device))
    except (ImportError, OSError, RuntimeError):
        return False


class FA3Backend(Backend):
    """Varlen paged attention: page ids are ``slot // page_size`` from the page table."""

    name = "fa3"

    def __init__(self, dtype: torch.dtype | None = None) -> None:
        from sgl_kernel import merge_state_v2
        from sgl_kernel.flash_attn import flash_attn_with_kvcache, get_scheduler_metadata

        self._kernel, self._merge, self._schedule = (
            flash_attn_with_kvcache,
            merge_state_v2,
            get_scheduler_metadata,
        )
        self.planned = os.environ.get("GRAPHRT_FA3_PLAN", "1") != "0"
        self.num_splits = int(os.environ.get("GRAPHRT_FA3_NUM_SPLITS", "0"))

    @classmethod
    def available(cls, device: torch.device, dtype: torch.dtype | None = None, **_: Any) -> bool:
        return fa3_available(device, dtype)

    def buffers(self) -> BufferGroup | None:
        return BufferGroup(SCHEDULER_SPECS, FA3Buffers) if self.planned else None

    def plan(
        self,
        meta: StepMetadata,
        group: FA3Buffers | None,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        headdim_v: int | None = None,
    ) -> torch.Tensor | None:
        """The step's tile schedule in ``group.scheduler_metadata`` (a view of its head);
        ``headdim_v``: the value head dim when it is not ``q``'s (dense MLA)."""
        if group is None or meta.cascade is not None:
            return None
        b = meta.buffers
        schedule = self._schedule(
            batch_size=b.cache_seqlens.shape[0],
            max_seqlen_q=meta.max_seqlen_q,
            max_seqlen_k=b.page_table.shape[1] * meta.page_size,
            num_heads=q.shape[1],
            num_heads_k=k_cache.shape[2],
            headdim=q.shape[2],
            headdim_v=headdim_v,
            cache_seqlens=b.cache_seqlens,
            qkv_dtype=q.dtype,
            cu_seqlens_q=b.cu_seqlens_q,
            page_size=meta.page_size,
            causal=True,
            num_splits=self.num_splits,
        )
        n, out = schedule.shape[0], group.scheduler_metadata
        if n > out.shape[0]:
            raise RuntimeError(f"FA3 scheduler metadata of {n} int32 exceeds its buffer of {out.shape[0]}")
        # NOTE: copied into the static buffer inside the graph, so every replay re-plans in
        # place; the tail past n is never written (zero since allocation).
        out[:n].copy_(schedule)
        return out[:n]

    def forward(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        meta: StepMetadata,
        scale: float,
        window: int | None = None,
        plan: torch.Tensor | None = None,
        qv: torch.Tensor | None = None,
    ) -> torch.Tensor:
        if meta.cascade is not None:
            return self._cascade(q, k_cache, v_cache, meta, scale, qv)
        b = meta.buffers
        planned = plan is not None and window is None
        # NOTE: num_splits=0 lets FA3 pick splits from shapes (page-table width), never from
        # data, so the choice made at capture holds for every replay; a plan was made with
        # the backend's num_splits, so the call must pass the same.
        return self._kernel(
            q=q,
            k_cache=k_cache,
            v_cache=v_cache,
            qv=qv,
            page_table=b.page_table,
            cache_seqlens=b.cache_seqlens,
            cu_seqlens_q=b.cu_seqlens_q,
            max_seqlen_q=meta.max_seqlen_q,
            softmax_scale=scale,
            causal=True,
            window_size=(-1, -1) if window is None else (window, 0),
            scheduler_metadata=plan if planned else None,
            num_splits=self.num_splits if planned else 0,
        )

    def _cascade(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        meta: StepMetadata,
        scale: float,
        qv: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Prefix through the page table (non-causal) + expand lists over single slots, merged."""
        b, c = meta.buffers, meta.cascade
        assert c is not None
        common = {
            "qv": qv,
            "softmax_scale": scale,
            "causal": False,
            "num_splits": 0,
            "return_softmax_lse": True,
        }
        o_pre, lse_pre, *_ = self._kernel(
            q=q,
            k_cache=k_cache,
            v_cache=v_cache,
            page_table=b.page_table,
            cache_seqlens=c.prefix_seqlens,
            cu_seqlens_q=b.cu_seqlens_q,
            max_seqlen_q=meta.max_seqlen_q,
            **common,
        )
        # NOTE: the expand part sees the cache as pages of one slot, so its table lists slots.
        o_x, lse_x, *_ = self._kernel(
            q=q,
            k_cache=k_cache.view(-1, 1, *k_cache.shape[2:]),
            v_cache=v_cache.view(-1, 1, *v_cache.shape[2:]),
            page_table=c.expand_table,
            cache_seqlens=c.expand_seqlens,
            cu_seqlens_q=c.expand_cu_seqlens_q,
            max_seqlen_q=1,
            **common,
        )
        # NOTE: varlen FA3 returns lse as [heads, tokens]; merge_state wants [tokens, heads].
        out, _ = self._merge(o_pre, lse_pre.t().contiguous(), o_x, lse_x.t().contiguous())
        return out

    def host_scalars(self) -> dict[str, Any]:
        return {"fa3.causal": True, "fa3.num_splits": self.num_splits, "fa3.plan": self.planned}
