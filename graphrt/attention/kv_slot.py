"""Where a single-token step's new k and v go when the model's qkv projection stores them.

A decode step of one token can rotate q and k and store k and v in the qkv projection's epilogue
(``GRAPHRT_QKV_ROPE``, :mod:`graphrt.models.qkv_rope`): one launch fewer a layer than the
projection, then ``rope_store``. The model knows its weights, the context knows the cache and
the step's slot; :meth:`ForwardContext.kv_slot <graphrt.attention.context.ForwardContext.kv_slot>`
hands the model a :class:`KVSlot` for each layer the epilogue may store (:func:`slot_for`),
and the model hands it back to ``ctx.attention(..., stored=slot)``, which then only attends.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

#: The cache dtypes the epilogue writes (an FP8 cache keeps ``rope_store``'s quantising path).
DTYPES = (torch.bfloat16, torch.float16)


@dataclass(frozen=True, slots=True)
class KVSlot:
    """Where layer ``layer_id``'s new k and v of a single-token step go.

    ``k_cache``/``v_cache``: the layer's 16-bit caches ``[pages, page_size, Hk, D]``, contiguous;
    ``loc``: the step's ``out_cache_loc [1]`` int64 (a static buffer's view under capture).
    """

    layer_id: int
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    loc: torch.Tensor


def slot_for(
    loc: torch.Tensor, kv: Any, layer_id: int, dtype: torch.dtype, chunk: int | None
) -> KVSlot | None:
    """Layer ``layer_id``'s :class:`KVSlot` in cache ``kv`` at the step's ``loc``, or None where
    the epilogue does not store: more or fewer tokens than one, a window-pool layer (its own
    slots), a chunked-local layer, an FP8 cache or one not in the model's ``dtype``."""
    if chunk is not None or loc.shape[0] != 1 or layer_id in getattr(kv, "window_layers", ()):
        return None
    k_cache, v_cache = kv.k[layer_id], kv.v[layer_id]
    if dtype not in DTYPES or not k_cache.dtype == v_cache.dtype == dtype:
        return None
    return (
        KVSlot(layer_id, k_cache, v_cache, loc)
        if k_cache.is_contiguous() and v_cache.is_contiguous()
        else None
    )


def check_stored(stored: KVSlot, layer_id: int, loc: torch.Tensor) -> None:
    """A clear error when ``stored`` is not layer ``layer_id``'s slot at this step's ``loc``."""
    if stored.layer_id != layer_id or stored.loc is not loc:
        raise ValueError(
            f"layer {layer_id} was told its k/v are stored, at layer {stored.layer_id}'s slot "
            f"{'of this step' if stored.loc is loc else 'of another step'}: pass the KVSlot "
            "ctx.kv_slot gave for this layer"
        )
