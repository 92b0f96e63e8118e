"""The one record an attention backend is called with: a layer's query, caches and options.

Every backend hook (``takes``, ``plan``, ``forward``, ``cross``) receives
an :class:`AttendCall`, so the contract's arguments are written once, here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from graphrt.kv.quant import LayerScales
from graphrt.metadata.base import StepMetadata


@dataclass(frozen=True, slots=True)
class FreshKV:
    """A step's new keys and values, not stored yet, for a backend that rotates and stores them
    itself (``fuses_store``) instead of :func:`~graphrt.kv.rope_store.rope_store`.

    ``k``/``v [num_tokens, num_kv_heads, head_dim]`` (views of the projection: any token
    stride), ``k`` not rotated yet; ``cos_sin [num_tokens, head_dim]`` the step's RoPE angles
    (NeoX halves), which rotate ``k`` and the call's ``q``; ``loc [num_tokens]`` int64 the slots
    the rotated ``k`` and ``v`` go to.
    """

    k: torch.Tensor
    v: torch.Tensor
    cos_sin: torch.Tensor
    loc: torch.Tensor


@dataclass(frozen=True, slots=True)
class AttendCall:
    """One layer's attention.

    MHA/GQA: ``q [num_tokens, num_q_heads, head_dim]``, the layer's caches ``k_cache
    [num_pages, page_size, num_kv_heads, head_dim]`` and ``v_cache [..., head_dim_v]``; dense MLA:
    ``q = q_rope``, ``k_cache`` the RoPE-key cache, ``v_cache`` the latent cache and ``qv [num_tokens,
    num_q_heads, kv_lora_rank]``; sparse MLA: ``q [num_tokens, num_heads, 576]``, ``k_cache`` and
    ``v_cache`` both the layer's latent cache (``[num_pages, page_size, 1, 576 | 656]``).

    ``meta``: what the layer attends with (the step's metadata, or a chunked-local virtual
    batch); ``scale``: the softmax scale; ``window``: a query at position ``p`` sees keys ``p -
    window … p`` only; ``plan``: what the backend's ``plan`` returned for this forward (None where
    it did not apply); ``sinks [num_q_heads]``: learned logits that join each softmax's
    denominator; ``kv_scales``: an FP8 cache's dequantisation scales for this layer; ``qv``: a
    second query scored against the values, ``score = (q . k + qv . v) * scale``; ``group``: the
    view of the backend's own buffer group for this step (sparse MLA: its
    :class:`~graphrt.metadata.sparse.SparseBuffers`); ``fresh``: the step's new keys and values,
    only in a call whose backend said it ``fuses_store``: then ``q`` is not rotated yet and the
    backend rotates it and stores ``fresh`` as ``rope_store`` would.
    """

    q: torch.Tensor
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    meta: StepMetadata
    scale: float
    window: int | None = None
    plan: Any = None
    sinks: torch.Tensor | None = None
    kv_scales: LayerScales | None = None
    qv: torch.Tensor | None = None
    group: Any = None
    fresh: FreshKV | None = None

    def options(self) -> tuple[Any, ...]:
        """The options a plain kernel path does without: window, sinks, FP8 scales, ``qv``."""
        return (self.window, self.sinks, self.kv_scales, self.qv)
