"""FA3 through ``sgl_kernel.flash_attn.flash_attn_with_kvcache`` (Hopper, paged KV)."""

from __future__ import annotations

import importlib.util
from typing import Any

import torch

from graphrt.attention.base import register
from graphrt.metadata import StepMetadata


def fa3_available(device: torch.device) -> bool:
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
        from sgl_kernel.flash_attn import flash_attn_with_kvcache

        self._kernel = flash_attn_with_kvcache

    def forward(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        meta: StepMetadata,
        scale: float,
        window: int | None = None,
    ) -> torch.Tensor:
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

    def host_scalars(self) -> dict[str, Any]:
        return {"fa3.causal": True, "fa3.num_splits": 0}


register("fa3", fa3_available)(FA3Backend)
