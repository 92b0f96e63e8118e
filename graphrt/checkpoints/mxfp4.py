"""MXFP4 tensors (gpt-oss's Hub checkpoints) dequantized at load, one tensor at a time.

An MXFP4 tensor ``X`` is stored as two: ``X_blocks`` ``[*lead, R, G, 16]`` uint8 (two e2m1 values
a byte, the low nibble first) and ``X_scales`` ``[*lead, R, G]`` uint8 (one e8m0 exponent per 32
values, bias 127). Row ``r`` dequantized holds ``G * 32`` values: ``FP4_VALUES[nibble] *
2 ** (scale - 127)``. transformers' parameter is that transposed (``[E, G * 32, R]``: gpt-oss's
``gate_up_proj`` ``[E, H, 2 I]``, ``down_proj`` ``[E, I, H]``); the source presents the pair
under the parameter's name and shape, so the bf16 checkpoints' tensor map loads both.

The math mirrors transformers' ``integrations.mxfp4.convert_moe_packed_tensors`` (the same
value table, ``ldexp`` with ``scale - 127``), vectorised over chunks of blocks so the index
temporaries stay small; one tensor (one layer's projection) is dequantized at a time.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from graphrt.checkpoints.errors import CheckpointError

Shape = tuple[int, ...]

#: The 16 e2m1 values by nibble: sign bit 3, then two exponent bits and one mantissa bit.
FP4_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)
#: Values per e8m0 scale, packed bytes per block, the scale's exponent bias.
BLOCK, BLOCK_BYTES, SCALE_BIAS = 32, 16, 127
#: Blocks dequantized at a time (32 Mi values).
CHUNK_BLOCKS = 1 << 20
#: A packed tensor's two stored parts, by name suffix.
BLOCKS, SCALES = "_blocks", "_scales"
#: The tensors an MXFP4 checkpoint may pack (gpt-oss's routed experts), by name suffix; any other
#: packed tensor is refused with its dtype.
PACKED = ("mlp.experts.gate_up_proj", "mlp.experts.down_proj")
#: ``quant_method`` → the architectures whose checkpoints in it are dequantized at load.
DEQUANTIZED_AT_LOAD: dict[str, tuple[str, ...]] = {"mxfp4": ("GptOssForCausalLM",)}


def quant_method(raw: Mapping[str, Any], architecture: str) -> str | None:
    """A ``config.json``'s ``quantization_config.quant_method`` when graphrt dequantizes it at
    load for ``architecture``, None without one; ``ValueError`` naming any other method."""
    quant = raw.get("quantization_config")
    if not quant:
        return None
    method = quant.get("quant_method", "unknown") if isinstance(quant, Mapping) else quant
    if architecture in DEQUANTIZED_AT_LOAD.get(str(method), ()):
        return str(method)
    held = "; ".join(f"{m} for {', '.join(a)}" for m, a in DEQUANTIZED_AT_LOAD.items())
    raise ValueError(
        f"quantization {method!r} is not supported for {architecture} safetensors checkpoints "
        f"(dequantized at load: {held}); load a dequantized checkpoint or a GGUF file"
    )


def dequantize(blocks: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """MXFP4 ``blocks`` ``[*lead, G, 16]`` uint8 and ``scales`` ``[*lead, G]`` uint8 →
    ``[*lead, G * 32]`` of ``dtype``, on their device (rows as stored, not transposed).

    Every value is exact in bf16 and fp32 (two significant bits times a power of two).
    """
    if blocks.shape[:-1] != scales.shape or blocks.shape[-1] != BLOCK_BYTES:
        raise ValueError(f"MXFP4 blocks {list(blocks.shape)} do not match scales {list(scales.shape)}")
    lut = torch.tensor(FP4_VALUES, dtype=dtype, device=blocks.device)
    out = torch.empty(*scales.shape, BLOCK, dtype=dtype, device=blocks.device)
    flat_blocks, flat_exp, flat_out = (
        blocks.reshape(-1, BLOCK_BYTES),
        scales.reshape(-1, 1),
        out.view(-1, BLOCK),
    )
    # NOTE: in chunks: the nibble indices (int32, 4 bytes per value) stay a chunk's size.
    for start in range(0, flat_exp.shape[0], CHUNK_BLOCKS):
        blk, sub = flat_blocks[start : start + CHUNK_BLOCKS], flat_out[start : start + CHUNK_BLOCKS]
        sub[:, 0::2] = lut[(blk & 0x0F).int()]
        sub[:, 1::2] = lut[(blk >> 4).int()]
        torch.ldexp(sub, flat_exp[start : start + CHUNK_BLOCKS].int() - SCALE_BIAS, out=sub)
    return out.view(*scales.shape[:-1], scales.shape[-1] * BLOCK)


@dataclass(frozen=True, slots=True)
class Packed:
    """One MXFP4 tensor of a checkpoint: its stored ``blocks`` and ``scales`` names and the
    ``shape`` transformers' dequantized parameter has (``[E, G * 32, R]``)."""

    blocks: str
    scales: str
    shape: Shape

    def read(self, get: Callable[[str], torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
        """Dequantized from ``get(name)`` (the stored tensor, on the target device), in
        transformers' layout: a transposed view of the rows as stored (no copy)."""
        return dequantize(get(self.blocks), get(self.scales), dtype).transpose(1, 2)


def packed_tensors(headers: Mapping[str, tuple[str, Shape]]) -> dict[str, Packed]:
    """The MXFP4 tensors among ``headers`` (name → (safetensors dtype, shape)), by the name of
    the parameter they dequantize to; ``CheckpointError`` naming a blocks tensor whose scales
    are missing, of another dtype than U8, of a shape that does not match, or stored beside the
    dequantized tensor of its name."""
    out: dict[str, Packed] = {}
    for name, (dtype, shape) in headers.items():
        base = name.removesuffix(BLOCKS)
        if base == name or not base.endswith(PACKED):
            continue
        scales = headers.get(base + SCALES)
        if scales is None:
            raise CheckpointError(f"MXFP4 tensor {name!r} has no {base + SCALES!r}")
        if (dtype, scales[0]) != ("U8", "U8"):
            raise CheckpointError(
                f"MXFP4 tensors {name!r} / {base + SCALES!r}: dtypes {dtype} / {scales[0]}, want U8"
            )
        if len(shape) != 4 or shape[-1] != BLOCK_BYTES or tuple(shape[:-1]) != tuple(scales[1]):
            raise CheckpointError(
                f"MXFP4 tensor {name!r} has shape {list(shape)}, want [E, R, G, {BLOCK_BYTES}] with "
                f"{base + SCALES!r} [E, R, G] (found {list(scales[1])})"
            )
        if base in headers:
            raise CheckpointError(f"tensor {base!r} is stored both as it is and as MXFP4 {name!r}")
        e, r, g, _ = shape
        out[base] = Packed(name, base + SCALES, (e, g * BLOCK, r))
    return out
