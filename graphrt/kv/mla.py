"""MLA KV cache for sparse attention (DSA): one latent row per token, BF16 or FlashMLA FP8.

Layouts (per token, per layer):

* ``"bf16"``: ``[576]`` bfloat16 — the 512-wide latent ``c_kv`` then the 64-wide RoPE key.
* ``"fp32"``: the same ``[576]`` in float32 (an fp32 model's cache: the torch reference only).
* ``"fp8"``: 656 bytes, FlashMLA's "FP8 with scale" format — 512 ``float8_e4m3fn`` values,
  4 ``float32`` scales (one per 128 values), 64 ``bfloat16`` RoPE values. Quantised on write.

Beside it lives the indexer's key cache (``[slots, index_dim]``, the model's dtype), written
at the same ``out_cache_loc``. As in :class:`~graphrt.kv.PagedKVCache`, the last page is
the dummy page and its first slot the dummy slot.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from graphrt.kv.paged import PagedSlots

KV_LORA_RANK = 512
ROPE_DIM = 64
QK_DIM = KV_LORA_RANK + ROPE_DIM  # 576
TILE = 128
NUM_TILES = KV_LORA_RANK // TILE
FP8_BYTES = KV_LORA_RANK + 4 * NUM_TILES + 2 * ROPE_DIM  # 656
FP8_MAX = 448.0
LAYOUTS = ("bf16", "fp8", "fp32")
#: Layouts that store the 576 values unquantised, in this dtype (``"fp8"`` packs 656 bytes).
PLAIN_LAYOUTS: dict[str, torch.dtype] = {"bf16": torch.bfloat16, "fp32": torch.float32}


@dataclass(frozen=True, slots=True)
class MLAShape:
    """Geometry of the MLA cache and of the sparse index the runtime sizes buffers for."""

    num_layers: int
    page_size: int
    num_pages: int  # including the reserved dummy page
    index_dim: int
    index_topk: int
    num_heads: int  # query heads (the FlashMLA backend pads them to 64 or 128)


def quantize_fp8(x: torch.Tensor) -> torch.Tensor:
    """``x [n, 576]`` → ``[n, 656]`` uint8 rows in the FlashMLA FP8 layout.

    Scales are powers of two (``2^ceil(log2(amax / 448))``, as DeepSeek's reference does), so
    dividing by them is exact and the only error is the e4m3 rounding of the scaled value:
    ``|x - dequant(x)| <= max(|x| / 16, scale / 1024)`` per element (3 mantissa bits; the
    second term covers e4m3 subnormals).
    """
    n = x.shape[0]
    nope = x[:, :KV_LORA_RANK].float().view(n, NUM_TILES, TILE)
    amax = nope.abs().amax(dim=-1).div(FP8_MAX).clamp_min(1e-4)
    scale = torch.exp2(torch.ceil(torch.log2(amax)))  # [n, 4] float32
    q = (nope / scale[:, :, None]).to(torch.float8_e4m3fn).view(torch.uint8).view(n, KV_LORA_RANK)
    rope = x[:, KV_LORA_RANK:].to(torch.bfloat16).contiguous().view(torch.uint8)
    return torch.cat((q, scale.contiguous().view(torch.uint8), rope), dim=-1)


def dequantize_fp8(rows: torch.Tensor) -> torch.Tensor:
    """``rows [..., 656]`` uint8 → ``[..., 576]`` float32 (the kernel's view of the cache)."""
    lead = rows.shape[:-1]
    flat = rows.reshape(-1, FP8_BYTES)
    nope = flat[:, :KV_LORA_RANK].contiguous().view(torch.float8_e4m3fn).float()
    scale = flat[:, KV_LORA_RANK : KV_LORA_RANK + 4 * NUM_TILES].contiguous().view(torch.float32)
    rope = flat[:, KV_LORA_RANK + 4 * NUM_TILES :].contiguous().view(torch.bfloat16).float()
    nope = (nope.view(-1, NUM_TILES, TILE) * scale[:, :, None]).view(-1, KV_LORA_RANK)
    return torch.cat((nope, rope), dim=-1).view(*lead, QK_DIM)


class MLAKVCache(PagedSlots):
    """Per-layer latent caches ``[num_pages, page_size, 1, 576 | 656]`` plus indexer keys.

    Parameters
    ----------
    shape : MLAShape
    layout : {"bf16", "fp8", "fp32"}
    index_dtype : torch.dtype
        dtype of the indexer key cache (the model's).
    device : torch.device
    """

    def __init__(self, shape: MLAShape, layout: str, index_dtype: torch.dtype, device: torch.device) -> None:
        if layout not in LAYOUTS:
            raise ValueError(f"MLA KV layout must be one of {LAYOUTS}, got {layout!r}")
        if shape.num_pages < 2:
            raise ValueError(f"num_pages must be >= 2 (one is the dummy), got {shape.num_pages}")
        self.shape, self.layout, self.device = shape, layout, device
        plain = PLAIN_LAYOUTS.get(layout)
        width, dtype = (QK_DIM, plain) if plain is not None else (FP8_BYTES, torch.uint8)
        size = (shape.num_pages, shape.page_size, 1, width)
        self.kv = [torch.zeros(size, dtype=dtype, device=device) for _ in range(shape.num_layers)]
        slots = shape.num_pages * shape.page_size
        self.index_k = [
            torch.zeros(slots, shape.index_dim, dtype=index_dtype, device=device)
            for _ in range(shape.num_layers)
        ]

    @property
    def index_topk(self) -> int:
        return self.shape.index_topk

    @property
    def bytes_per_token(self) -> int:
        """Latent bytes per token per layer: 1152 (bf16), 656 (fp8) or 2304 (fp32)."""
        return self.kv[0].shape[-1] * self.kv[0].element_size()

    def rows(self, layer: int) -> torch.Tensor:
        """Layer ``layer`` as ``[slots, width]`` (a view)."""
        return self.kv[layer].view(-1, self.kv[layer].shape[-1])

    def store_latent(self, layer: int, loc: torch.Tensor, latent: torch.Tensor) -> None:
        """Write ``latent [n, 576]`` at slots ``loc`` (int64), quantised for fp8."""
        plain = PLAIN_LAYOUTS.get(self.layout)
        rows = latent.to(plain) if plain is not None else quantize_fp8(latent)
        self.rows(layer).index_copy_(0, loc, rows)

    def gather(self, layer: int, slots: torch.Tensor) -> torch.Tensor:
        """Float32 latent rows ``[..., 576]`` at ``slots`` (int64, any shape; dequantised)."""
        rows = self.rows(layer)[slots]
        return dequantize_fp8(rows) if self.layout == "fp8" else rows.float()
