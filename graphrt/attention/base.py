"""The attention-backend contract: one file per backend, one row in the registry.

A backend owns everything its kernels need beyond the step's shared metadata:

- ``buffers()``: its own per-step buffer group (specs + the dataclass naming them), allocated
  once with the other groups and viewed per bucket; ``None`` when it needs none;
- ``write_host(batch, host, rows)``: the host half of that group's update, when it has
  host-written buffers (its ``BufferGroup.write``; copied to the device with the others);
- ``plan(meta, group, q, k_cache)``: in-graph work run once per forward, before the first
  layer's attention (e.g. FA3's scheduler metadata); its result reaches every layer's
  ``forward`` as ``plan``;
- ``graph_support``: the forward modes its kernels may be captured for;
- ``store_and_attend(q, k, v, cos_sin, k_cache, v_cache, loc, meta, scale, ...)``: RoPE, the KV
  store and attention in one go where its kernels can (else None: the context runs
  ``rope_store``, then ``forward``);
- ``cross(q, k_cache, v_cache, meta, encoder, scale)``: non-causal attention over each
  request's encoder K/V (encoder-decoder models), for the backends that have it.

Selection lives in :mod:`graphrt.attention.registry`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import torch

from graphrt.kv.quant import LayerScales
from graphrt.metadata.base import StepMetadata
from graphrt.metadata.groups import BufferGroup
from graphrt.step.batch import Batch
from graphrt.step.modes import ForwardMode


@dataclass(frozen=True, slots=True)
class GraphSupport:
    """Where a backend's kernels may be captured: ``modes`` (default: all), buckets up to
    ``max_bucket`` (None: any). The runtime refuses a configuration outside it, naming both."""

    modes: frozenset[ForwardMode] = field(default_factory=lambda: frozenset(ForwardMode))
    max_bucket: int | None = None

    def refusal(self, backend: str, modes: tuple[ForwardMode, ...], largest: int) -> str | None:
        """Why ``backend`` cannot be captured for ``modes`` up to bucket ``largest``, or None."""
        missing = [m.name for m in modes if m not in self.modes]
        if missing:
            ok = ", ".join(sorted(m.name for m in self.modes)) or "none"
            return f"attention backend {backend!r} cannot be captured for {', '.join(missing)} (it supports {ok})"
        if self.max_bucket is not None and largest > self.max_bucket:
            return f"attention backend {backend!r} is captured for buckets up to {self.max_bucket}, not {largest}"
        return None


class AttentionBackend(Protocol):
    """Paged attention over the KV cache for one layer (MHA/GQA, and dense MLA with ``qv``).

    ``forward`` takes ``q [num_tokens, num_q_heads, head_dim]`` and the layer's caches
    ``k_cache [num_pages, page_size, num_kv_heads, head_dim]``, ``v_cache [..., head_dim_v]``
    and returns ``[num_tokens, num_q_heads, head_dim_v]`` in ``q``'s dtype. Query token ``i``
    of request ``b`` sits at position ``cache_seqlens[b] - q_len_b + i`` and attends causally;
    with ``window`` it sees keys ``position - window … position`` only (FA3 ``window_size=(w,
    0)``). ``plan`` is what :meth:`plan` returned for this forward (None where it did not
    apply).

    Options a layer may pass: ``kv_scales`` (an FP8 cache's dequantisation scales for this
    layer: keys are ``k_cache * kv_scales.k``, values ``v_cache * kv_scales.v``, and the query is
    rounded to FP8 as the kernel reads it, :mod:`graphrt.kv.quant`); ``sinks [num_q_heads]``
    (learned per-head logits that join each softmax's denominator, ``exp(sink - max)``, with no
    value: gpt-oss). A token tree's cascade counts the sink once, in its prefix half. ``qv
    [num_tokens, num_q_heads, head_dim_v]`` (FA3's ``qv``): a second query scored against the
    values, ``score = (q . k + qv . v) * scale`` (dense MLA's absorbed form).
    """

    name: str
    graph_support: GraphSupport

    def buffers(self) -> BufferGroup | None: ...

    def write_host(self, batch: Batch, host: dict[str, np.ndarray], rows: int) -> None: ...

    def plan(self, meta: StepMetadata, group: Any, q: torch.Tensor, k_cache: torch.Tensor) -> Any: ...

    def forward(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        meta: StepMetadata,
        scale: float,
        window: int | None = None,
        plan: Any = None,
        sinks: torch.Tensor | None = None,
        kv_scales: LayerScales | None = None,
        qv: torch.Tensor | None = None,
    ) -> torch.Tensor: ...

    def host_scalars(self) -> dict[str, Any]:
        """Python values this backend hands to its kernels beyond the metadata's."""
        ...

    def store_and_attend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        cos_sin: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        loc: torch.Tensor,
        meta: StepMetadata,
        scale: float,
        window: int | None = None,
        sinks: torch.Tensor | None = None,
        kv_scales: LayerScales | None = None,
    ) -> torch.Tensor | None:
        """What ``rope_store`` then :meth:`forward` compute, in one go, or None where the backend
        does not fuse them for these inputs (the context then runs the two).

        ``q [num_tokens, num_q_heads, head_dim]`` and ``k``/``v [num_tokens, num_kv_heads,
        head_dim]`` not yet rotated (views of the qkv projection), ``cos_sin [num_tokens,
        head_dim]``, ``loc [num_tokens]`` int64 slots; returns what :meth:`forward` returns and
        leaves the caches exactly as ``rope_store`` does (rotated ``k`` and ``v`` at ``loc``)."""
        ...

    def cross(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        meta: StepMetadata,
        encoder: Any,
        scale: float,
        kv_scales: LayerScales | None = None,
    ) -> torch.Tensor:
        """Cross-attention: ``q [num_tokens, num_q_heads, head_dim]`` (packed by
        ``meta.buffers.cu_seqlens_q``) attends, non-causally, every key of its request's encoder
        output: ``encoder.encoder_page_table [bs, pages]`` (page ids into ``k_cache`` /
        ``v_cache``, the encoder cache's layer) and ``encoder.encoder_lens [bs]``. Returns
        ``[num_tokens, num_q_heads, head_dim]`` in ``q``'s dtype."""
        ...


class Backend:
    """Defaults for the hooks a backend does not need: no buffers, no host write, no plan,
    every mode graphed, no host scalars. Subclass and override what the kernels need."""

    name = "backend"
    graph_support = GraphSupport()

    @classmethod
    def available(cls, device: torch.device, **need: Any) -> bool:
        """Whether it runs on ``device`` for ``need`` (the kind's build arguments)."""
        return True

    def buffers(self) -> BufferGroup | None:
        return None

    def write_host(self, batch: Batch, host: dict[str, np.ndarray], rows: int) -> None:
        return None

    def plan(self, meta: StepMetadata, group: Any, *tensors: torch.Tensor) -> Any:
        """No plan. (MHA backends receive ``q`` and the first layer's ``k_cache``; dense-MLA
        backends ``q_rope`` and the first layer's RoPE and latent caches; sparse-MLA backends
        nothing beyond their group.)"""
        return None

    def host_scalars(self) -> dict[str, Any]:
        return {}

    def store_and_attend(self, q: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor | None:
        """No fused RoPE + store + attention (see :meth:`AttentionBackend.store_and_attend`)."""
        return None

    def cross(self, q: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        """No cross-attention (see :meth:`AttentionBackend.cross`)."""
        raise ValueError(
            f"attention backend {self.name!r} has no cross-attention (encoder-decoder models): "
            "use 'fa3' or 'reference'"
        )
