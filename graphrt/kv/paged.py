"""Paged KV cache for MHA/GQA with a reserved dummy page, and the page geometry every cache shares."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from graphrt.kv.quant import FP8, KVScales, LayerScales, is_fp8, storage, store_slots
from graphrt.kv.window import WindowLayers

KV_DTYPES = (torch.bfloat16, torch.float16, torch.float32, FP8)


@dataclass(frozen=True, slots=True)
class KVShape:
    """Geometry of a paged MHA/GQA KV cache: layers, KV heads, head dim, pages."""

    num_layers: int
    num_kv_heads: int
    head_dim: int
    page_size: int
    num_pages: int  # including the reserved dummy page


class PagedSlots:
    """Page geometry shared by every KV cache: the last page is the reserved dummy page.

    Subclasses set ``self.shape`` with ``page_size`` and ``num_pages`` (dummy included).
    """

    shape: Any

    @property
    def page_size(self) -> int:
        return self.shape.page_size

    @property
    def dummy_page(self) -> int:
        return self.shape.num_pages - 1

    @property
    def dummy_slot(self) -> int:
        return self.dummy_page * self.shape.page_size

    @property
    def num_live_slots(self) -> int:
        """Slots ``0 .. num_live_slots-1`` may hold real tokens."""
        return self.dummy_slot


class PagedKVCache(PagedSlots):
    """Per-layer K and V caches of shape ``[num_pages, page_size, num_kv_heads, head_dim]``.

    The last page is reserved as the dummy page and its first slot as the dummy slot:
    padded rows of a graph read that page and write that slot, never a live one (and never
    slot 0, which belongs to a live page).

    An FP8 cache (``torch.float8_e4m3fn``, one byte per element) also holds each layer's K and
    V dequantisation scales (``k_scale``, ``v_scale``: ``[num_layers]`` float32, from
    ``scales`` or 1.0); every store quantises (:func:`graphrt.kv.quant.quantize`).

    ``window``: the layers that keep their K and V in the window pool instead
    (:mod:`graphrt.kv.window`): ``[window.num_pages, page_size, num_kv_heads, head_dim]`` each,
    addressed by window slots, with that pool's last page as their dummy page.
    """

    def __init__(
        self,
        shape: KVShape,
        dtype: torch.dtype,
        device: torch.device,
        scales: KVScales | None = None,
        window: WindowLayers | None = None,
    ) -> None:
        if dtype not in KV_DTYPES:
            raise TypeError(f"KV dtype must be one of {KV_DTYPES}, got {dtype}")
        if shape.num_pages < 2:
            raise ValueError(f"num_pages must be >= 2 (one is the dummy), got {shape.num_pages}")
        self.shape, self.dtype, self.device, self.window = shape, dtype, device, window
        if window is not None and not window.layers <= set(range(shape.num_layers)):
            raise ValueError(f"window layers {sorted(window.layers)} outside 0..{shape.num_layers - 1}")
        self.window_layers = frozenset() if window is None else window.layers
        sizes = [self._layer_size(i) for i in range(shape.num_layers)]
        self.k = [torch.zeros(size, dtype=dtype, device=device) for size in sizes]
        self.v = [torch.zeros(size, dtype=dtype, device=device) for size in sizes]
        self.k_scale: torch.Tensor | None = None
        self.v_scale: torch.Tensor | None = None
        if is_fp8(dtype):
            self.set_scales(scales or KVScales.ones(shape.num_layers))

    def _layer_size(self, layer: int) -> tuple[int, int, int, int]:
        s = self.shape
        pages = (
            self.window.num_pages if self.window is not None and layer in self.window.layers else s.num_pages
        )
        return (pages, s.page_size, s.num_kv_heads, s.head_dim)

    def set_scales(self, scales: KVScales) -> None:
        """Per-layer dequantisation scales of an FP8 cache, written in place (graphs read them
        where they are, so captured graphs use the new values)."""
        if not is_fp8(self.dtype):
            raise ValueError(f"KV scales apply to an FP8 cache, this one is {self.dtype}")
        n = self.shape.num_layers
        if len(scales.k) != n:
            raise ValueError(f"{len(scales.k)} layers of KV scales for a cache of {n} layers")
        k, v = (torch.tensor(s, dtype=torch.float32) for s in (scales.k, scales.v))
        if self.k_scale is None or self.v_scale is None:
            self.k_scale, self.v_scale = k.to(self.device), v.to(self.device)
        else:
            self.k_scale.copy_(k)
            self.v_scale.copy_(v)

    def scales(self, layer: int) -> LayerScales | None:
        """Layer ``layer``'s scales (``[1]`` views), or None for a 16/32-bit cache."""
        if self.k_scale is None or self.v_scale is None:
            return None
        return LayerScales(self.k_scale[layer : layer + 1], self.v_scale[layer : layer + 1])

    def store(self, layer: int, loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Write ``k``/``v`` ``[num_tokens, num_kv_heads, head_dim]`` at slots ``loc`` (int64)."""
        scales = self.scales(layer)
        store_slots(self.k[layer], loc, k, None if scales is None else scales.k)
        store_slots(self.v[layer], loc, v, None if scales is None else scales.v)

    def slot_rows(self) -> list[torch.Tensor]:
        """Every layer's K then V as ``[num_slots, num_kv_heads, head_dim]`` storage views
        (bytes for FP8), for copies of whole slots."""
        if self.window is not None:
            raise ValueError(
                "KV slots cannot be moved in a cache with a window pool (its layers hold window slots)"
            )
        kvh, d = self.shape.num_kv_heads, self.shape.head_dim
        return [storage(t).view(-1, kvh, d) for t in (*self.k, *self.v)]

    @property
    def bytes_per_token(self) -> int:
        """K and V bytes one token takes in every layer together."""
        return token_bytes(self.shape, self.dtype)

    @property
    def nbytes(self) -> int:
        """Bytes of every page (the dummy pages included) of every layer's K and V (window
        layers: their pool's pages)."""
        return sum(t.numel() * t.element_size() for t in (*self.k, *self.v))


def token_bytes(shape: KVShape, dtype: torch.dtype) -> int:
    """K and V bytes one token takes in every layer of a ``dtype`` cache of ``shape``."""
    return 2 * shape.num_layers * shape.num_kv_heads * shape.head_dim * dtype.itemsize
