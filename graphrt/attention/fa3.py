"""FA3 through ``sgl_kernel.flash_attn.flash_attn_with_kvcache`` (Hopper, paged KV)."""

from __future__ import annotations

import importlib.util
from typing import Any

import torch

from graphrt.attention.registry import register
from graphrt.metadata.base import StepMetadata

#: KV/query dtypes the FA3 kernel takes (it refuses fp32 at launch).
FA3_DTYPES = (torch.bfloat16, torch.float16)


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


class FA3Backend:
    """Varlen paged attention: page ids are ``slot // page_size`` from the page table."""

    name = "fa3"

    def __init__(self) -> None:
        from sgl_kernel import merge_state_v2
        from sgl_kernel.flash_attn import flash_attn_with_kvcache

        self._kernel, self._merge = flash_attn_with_kvcache, merge_state_v2

    def forward(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        meta: StepMetadata,
        scale: float,
        window: int | None = None,
    ) -> torch.Tensor:
        if meta.cascade is not None:
            return self._cascade(q, k_cache, v_cache, meta, scale)
        b = meta.buffers
        # NOTE: num_splits=0 lets FA3 pick splits from shapes (page-table width), never from
        # data, so the choice made at capture holds for every replay.
        return self._kernel(
            q=q,
            k_cache=k_cache,
            v_cache=v_cache,
            page_table=b.page_table,
            cache_seqlens=b.cache_seqlens,
            cu_seqlens_q=b.cu_seqlens_q,
            max_seqlen_q=meta.max_seqlen_q,
            softmax_scale=scale,
            causal=True,
            window_size=(-1, -1) if window is None else (window, 0),
            num_splits=0,
        )

    def _cascade(
        self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta: StepMetadata, scale: float
    ) -> torch.Tensor:
        """Prefix through the page table (non-causal) + expand lists over single slots, merged."""
        b, c = meta.buffers, meta.cascade
        assert c is not None
        common = {"softmax_scale": scale, "causal": False, "num_splits": 0, "return_softmax_lse": True}
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
        slots = (-1, 1, *k_cache.shape[2:])
        o_x, lse_x, *_ = self._kernel(
            q=q,
            k_cache=k_cache.view(slots),
            v_cache=v_cache.view(slots),
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
        return {"fa3.causal": True, "fa3.num_splits": 0}


register("mha", "fa3", fa3_available)(FA3Backend)
