"""FA3 through ``sgl_kernel.flash_attn.flash_attn_with_kvcache`` (Hopper, paged KV).

The backend owns one buffer, ``scheduler_metadata``: FA3's tile schedule for the step, planned
once per forward (inside the graph) by ``get_scheduler_metadata`` and read by every layer, in
place of the ``prepare_varlen_num_blocks`` kernel FA3 otherwise runs before each layer. The
plan uses what every layer's call uses, all functions of the graph key: ``max_seqlen_k`` is the
page table's width (what ``flash_attn_with_kvcache`` derives itself), ``num_splits`` the
bucket's (:mod:`graphrt.attention.fa3_plan`). Layers with a sliding window, token trees (cascade) and chunked-local layers keep
FA3's own per-call schedule.
``GRAPHRT_FA3_PLAN=0`` turns the plan off. ``qv`` (dense MLA's absorbed ``q_nope``, scored
against the values; :mod:`graphrt.attention.fa3_mla`) passes through to every call.

Options (SGLang's FA3 backend passes the same): an FP8 cache is read with the layer's scales as
``k_descale`` / ``v_descale`` (``[batch, num_kv_heads]`` stride-0 views of the cache's per-layer
scale, so graphs read them in place) and the query rounded to FP8 unscaled (FA3 takes q, k and
v in one dtype and returns bf16); ``sinks`` (bf16 ``[num_q_heads]``, what the kernel reads)
go to the prefix half of a token tree only: merging adds the halves' denominators.

Cross-attention (encoder-decoder models, SGLang's ``is_cross_attention`` layers): one call per
layer with ``causal=False`` over the encoder cache, ``page_table`` = the encoder page table and
``cache_seqlens`` = the encoder lengths, on FA3's own per-call schedule (the plan is the
self-attention's).

Single-token decode steps whose CTAs would leave the GPU short are :meth:`FA3Backend.yields`: the
registry's ``fa3`` row is a dispatch of the split decode kernel
(:mod:`graphrt.attention.split_decode.backend`) and this backend.
"""

from __future__ import annotations

import importlib.util
from typing import Any

import torch

from graphrt.attention.base import Backend, BufferGroup
from graphrt.attention.call import AttendCall
from graphrt.attention.capabilities import ALL_MODES, GraphSupport
from graphrt.attention.fa3_options import check_sinks, descale, fa3_query
from graphrt.attention.fa3_plan import SCHEDULER_SPECS, FA3Buffers, leaves_gpu_short, planned_splits, sm_count
from graphrt.kernels import switches
from graphrt.kernels.switches import batch_invariant_on
from graphrt.kv.quant import FP8

#: KV cache dtypes the FA3 kernel takes (it refuses fp32 at launch; FP8 with a 16-bit model).
FA3_DTYPES = (torch.bfloat16, torch.float16, FP8)


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
    graph_support = GraphSupport(
        ALL_MODES, trees=True, window=True, sinks=True, fp8_kv=True, cross=True, chunked_local=True
    )

    def __init__(self, dtype: torch.dtype | None = None, **_: Any) -> None:
        from sgl_kernel import merge_state_v2
        from sgl_kernel.flash_attn import flash_attn_with_kvcache, get_scheduler_metadata

        self._kernel, self._merge, self._schedule = (
            flash_attn_with_kvcache,
            merge_state_v2,
            get_scheduler_metadata,
        )
        self.planned = bool(switches.active()["GRAPHRT_FA3_PLAN"])

    def splits_for(self, batch: int, heads_k: int, device: torch.device) -> int:
        """:func:`planned_splits` on ``device`` (plan and calls pass the same); 1 (unsplit, for
        every bucket) in a batch-invariant forward."""
        if batch_invariant_on():
            return 1
        return planned_splits(batch, heads_k, sm_count(device))

    @classmethod
    def available(cls, device: torch.device, dtype: torch.dtype | None = None, **_: Any) -> bool:
        return fa3_available(device, dtype)

    def buffers(self) -> BufferGroup | None:
        return BufferGroup(SCHEDULER_SPECS, FA3Buffers) if self.planned else None

    def plan(self, call: AttendCall) -> torch.Tensor | None:
        """The step's tile schedule in ``call.group.scheduler_metadata`` (a view of its head)."""
        return self.schedule(call, None)

    def schedule(self, call: AttendCall, headdim_v: int | None) -> torch.Tensor | None:
        """:meth:`plan` with ``headdim_v``: the value head dim when it is not ``q``'s (dense MLA)."""
        meta, group, q, k_cache = call.meta, call.group, call.q, call.k_cache
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
            qkv_dtype=k_cache.dtype,  # NOTE: an FP8 cache's call reads q in FP8 too
            cu_seqlens_q=b.cu_seqlens_q,
            page_size=meta.page_size,
            causal=True,
            num_splits=self.splits_for(b.cache_seqlens.shape[0], k_cache.shape[2], q.device),
        )
        n, out = schedule.shape[0], group.scheduler_metadata
        if n > out.shape[0]:
            raise RuntimeError(f"FA3 scheduler metadata of {n} int32 exceeds its buffer of {out.shape[0]}")
        # NOTE: copied into the static buffer inside the graph, so every replay re-plans in
        # place; the tail past n is never written (zero since allocation).
        out[:n].copy_(schedule)
        return out[:n]

    def yields(self, call: AttendCall) -> bool:
        """Hands a dispatch's earlier part (split decode) the steps whose ``query rows x KV heads``
        (a decode step's requests, a verify chain's tokens) leave FA3's CTAs short of
        :data:`~graphrt.attention.fa3_plan.FULL_SHARE` of the SMs: fuller buckets keep FA3's call
        (there the Llama-3-8B step at bs 16 ran slower split). In a batch-invariant forward every
        decode step goes there: its split count never follows the bucket."""
        q = call.q
        return batch_invariant_on() or leaves_gpu_short(q.shape[0], call.k_cache.shape[2], sm_count(q.device))

    def forward(self, call: AttendCall) -> torch.Tensor:
        k_cache, meta, window, plan = call.k_cache, call.meta, call.window, call.plan
        sinks, kv_scales = call.sinks, call.kv_scales
        dtype, q = call.q.dtype, fa3_query(call.q, k_cache, kv_scales)
        check_sinks(sinks, q.shape[1])
        if meta.cascade is not None:
            out = self._cascade(call, q)
            return out if out.dtype == dtype else out.to(dtype)
        b = meta.buffers
        planned = plan is not None and window is None
        # NOTE: num_splits=0 lets FA3 pick splits from shapes (page-table width), never from
        # data, so the choice made at capture holds for every replay; a plan was made with
        # the backend's num_splits, so the call must pass the same.
        out = self._kernel(
            q=q,
            k_cache=k_cache,
            v_cache=call.v_cache,
            qv=call.qv,
            page_table=b.page_table,
            cache_seqlens=b.cache_seqlens,
            cu_seqlens_q=b.cu_seqlens_q,
            max_seqlen_q=meta.max_seqlen_q,
            softmax_scale=call.scale,
            causal=True,
            window_size=(-1, -1) if window is None else (window, 0),
            scheduler_metadata=plan if planned else None,
            num_splits=self.splits_for(b.cache_seqlens.shape[0], k_cache.shape[2], q.device)
            if planned or batch_invariant_on()
            else 0,
            **descale(kv_scales, b.cache_seqlens.shape[0], k_cache.shape[2]),
            **({} if sinks is None else {"sinks": sinks}),
        )
        return out if out.dtype == dtype else out.to(dtype)

    def _cascade(self, call: AttendCall, q: torch.Tensor) -> torch.Tensor:
        """Prefix through the page table (non-causal) + expand lists over single slots, merged.

        The sink joins the prefix call only (SGLang's backend passes it to both calls, which
        counts it twice: the merge adds the two denominators).
        """
        k_cache, v_cache, meta, kv_scales = call.k_cache, call.v_cache, call.meta, call.kv_scales
        b, c = meta.buffers, meta.cascade
        assert c is not None
        common = {
            "qv": call.qv,
            "softmax_scale": call.scale,
            "causal": False,
            "num_splits": 1 if batch_invariant_on() else 0,
            "return_softmax_lse": True,
        }
        kvh = k_cache.shape[2]
        o_pre, lse_pre, *_ = self._kernel(
            q=q,
            k_cache=k_cache,
            v_cache=v_cache,
            page_table=b.page_table,
            cache_seqlens=c.prefix_seqlens,
            cu_seqlens_q=b.cu_seqlens_q,
            max_seqlen_q=meta.max_seqlen_q,
            **descale(kv_scales, c.prefix_seqlens.shape[0], kvh),
            **({} if call.sinks is None else {"sinks": call.sinks}),
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
            **descale(kv_scales, c.expand_seqlens.shape[0], kvh),
            **common,
        )
        # NOTE: varlen FA3 returns lse as [heads, tokens]; merge_state wants [tokens, heads].
        out, _ = self._merge(o_pre, lse_pre.t().contiguous(), o_x, lse_x.t().contiguous())
        return out

    def cross(self, call: AttendCall, encoder: Any) -> torch.Tensor:
        """Every query token over all of its request's encoder K/V (non-causal)."""
        k_cache, v_cache, meta, kv_scales = call.k_cache, call.v_cache, call.meta, call.kv_scales
        dtype, q = call.q.dtype, fa3_query(call.q, k_cache, kv_scales)
        lens = encoder.encoder_lens
        out = self._kernel(
            q=q,
            k_cache=k_cache,
            v_cache=v_cache,
            page_table=encoder.encoder_page_table,
            cache_seqlens=lens,
            cu_seqlens_q=meta.buffers.cu_seqlens_q,
            max_seqlen_q=meta.max_seqlen_q,
            softmax_scale=call.scale,
            causal=False,
            num_splits=0,  # NOTE: FA3's own schedule from shapes: the same at every replay
            **descale(kv_scales, lens.shape[0], k_cache.shape[2]),
        )
        return out if out.dtype == dtype else out.to(dtype)

    def host_scalars(self) -> dict[str, Any]:
        return {"fa3.causal": True, "fa3.num_splits": "auto", "fa3.plan": self.planned}
