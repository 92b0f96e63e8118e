"""FP8 checkpoints (compressed-tensors ``float-quantized``, ``fp8`` block- or tensor-scaled) read
into graphrt's FP8 weight: e4m3 rows with one float32 scale per output row.

A stored FP8 weight ``X.weight`` ``[N, K]`` (safetensors ``F8_E4M3``) comes with a scale that
dequantizes it as ``W = q * s``:

- compressed-tensors, ``strategy: channel``: ``X.weight_scale`` ``[N, 1]``: loads straight into
  graphrt's per-row scale (exact);
- compressed-tensors ``strategy: tensor``, or ``fp8`` without ``weight_block_size``: one value
  ``X.weight_scale`` (``[]`` or ``[1]``), broadcast to every row (exact);
- ``fp8`` with ``weight_block_size [bn, bk]`` (DeepSeek-V3, Qwen3-FP8): ``X.weight_scale_inv``
  ``[ceil(N / bn), ceil(K / bk)]``, one value per block (multiplied, despite its name). graphrt
  requantizes such a weight at load to per-row FP8 from its dequantized fp32 values
  (:func:`graphrt.kernels.fp8_gemm.quantize`); that adds one e4m3 rounding per value:
  ``|W' - W| <= 2**-4 |W| + 2**-10 s_row`` with ``s_row = max_row |W| / 448``.

Activation scales (``input_scale``, static or dynamic schemes) are not read: graphrt's FP8 path
is weight-only (the weight is widened in registers and multiplied with the bf16 activations), so
the activations are never quantized and need no scale. Layers graphrt does not hold in FP8
(routed experts, dense-MLA projections, the LM head) are dequantized to the model dtype at load.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from graphrt.checkpoints.errors import CheckpointError
from graphrt.kernels import fp8_gemm

Shape = tuple[int, ...]
#: The safetensors dtype of an FP8 weight.
STORED = "F8_E4M3"
#: compressed-tensors ``format`` values whose FP8 weights are stored as e4m3 with their scales.
CT_FORMATS = ("float-quantized", "naive-quantized")
#: compressed-tensors weight strategies graphrt reads (others are refused by name).
CT_STRATEGIES = ("channel", "tensor")
#: Per-row scale name graphrt lists for a held FP8 weight ``X.weight``: ``X.weight_scale``.
SCALE = "_scale"


@dataclass(frozen=True, slots=True)
class FP8Scheme:
    """How a checkpoint's FP8 weights are scaled: ``strategy`` ``"channel"``, ``"tensor"`` or
    ``"block"`` (``block``: rows x columns per scale), the scale's name suffix after
    ``.weight``, and the ``quantization_config`` text that named it (for messages)."""

    method: str
    strategy: str
    suffix: str
    block: tuple[int, int] | None = None


def _refuse(method: str, what: str) -> ValueError:
    return ValueError(
        f"quantization {method!r} with {what} is not supported; FP8 checkpoints that load: "
        "compressed-tensors float-quantized (weights num_bits 8, type float, strategy channel or "
        "tensor) and fp8 (weight_block_size or per-tensor weight_scale, fmt e4m3)"
    )


def _compressed_tensors(quant: Mapping[str, Any]) -> FP8Scheme:
    method = "compressed-tensors"
    fmt = quant.get("format", "float-quantized")
    if fmt not in CT_FORMATS:
        raise _refuse(method, f"format {fmt!r}")
    groups = quant.get("config_groups") or {}
    if not isinstance(groups, Mapping) or not groups:
        raise _refuse(method, "no config_groups")
    strategies = set()
    for name, group in groups.items():
        w = (group or {}).get("weights") or {}
        kind = f"weights num_bits {w.get('num_bits')} type {w.get('type')}"
        if w.get("num_bits") != 8 or w.get("type") != "float":
            raise _refuse(method, f"config_groups.{name}: {kind} (int8 and int4 are not FP8)")
        if w.get("strategy") not in CT_STRATEGIES or w.get("dynamic") or not w.get("symmetric", True):
            raise _refuse(
                method,
                f"config_groups.{name}: weights strategy {w.get('strategy')!r}"
                f"{', dynamic' if w.get('dynamic') else ''}"
                f"{', asymmetric' if not w.get('symmetric', True) else ''}",
            )
        strategies.add(w["strategy"])
    # NOTE: channel and tensor scales both become per-row ones; one name for the message.
    return FP8Scheme(method, "channel" if "channel" in strategies else "tensor", "weight_scale")


def _fp8(quant: Mapping[str, Any]) -> FP8Scheme:
    if quant.get("fmt", "e4m3") != "e4m3":
        raise _refuse("fp8", f"fmt {quant.get('fmt')!r}")
    block = quant.get("weight_block_size")
    if block is None:
        return FP8Scheme("fp8", "tensor", "weight_scale")
    if not (
        isinstance(block, list | tuple)
        and len(block) == 2
        and all(isinstance(b, int) and b > 0 for b in block)
    ):
        raise _refuse("fp8", f"weight_block_size {block!r} (want [rows, columns] > 0)")
    return FP8Scheme("fp8", "block", "weight_scale_inv", (int(block[0]), int(block[1])))


#: ``quant_method`` → the reader of its ``quantization_config``.
METHODS = {"compressed-tensors": _compressed_tensors, "fp8": _fp8}


def fp8_scheme(raw: Mapping[str, Any]) -> FP8Scheme | None:
    """The FP8 scheme of a ``config.json`` (``quantization_config``), None when it names no FP8
    method; ``ValueError`` naming a compressed-tensors or fp8 scheme graphrt does not read."""
    quant = raw.get("quantization_config")
    if not isinstance(quant, Mapping) or quant.get("quant_method") not in METHODS:
        return None
    return METHODS[quant["quant_method"]](quant)


def scale_shapes(scheme: FP8Scheme, shape: Shape) -> tuple[Shape, ...]:
    """The shapes a weight ``[N, K]``'s scale may have under ``scheme``."""
    n, k = shape
    if scheme.block is not None:
        return ((math.ceil(n / scheme.block[0]), math.ceil(k / scheme.block[1])),)
    return ((n, 1), (n,)) if scheme.strategy == "channel" else ((), (1,))


@dataclass(frozen=True, slots=True)
class FP8Weight:
    """One stored FP8 weight: its ``scale`` tensor's name and shape, under ``scheme``."""

    scale: str
    shape: Shape
    scale_shape: Shape
    scheme: FP8Scheme

    def check(self) -> str | None:
        """What is wrong with the scale's shape, or None."""
        want = scale_shapes(self.scheme, self.shape)
        if self.scale_shape in want or (
            self.scheme.strategy == "channel" and math.prod(self.scale_shape) == 1
        ):
            return None  # NOTE: one value: a tensor-strategy group beside channel groups
        return f"{self.scale!r} has shape {list(self.scale_shape)}, want {' or '.join(str(list(w)) for w in want)}"

    def _scale(self, scale: torch.Tensor) -> torch.Tensor:
        """``scale`` in float32; :class:`CheckpointError` naming it when a value is not finite."""
        s = scale.float()
        if not bool(torch.isfinite(s).all()):  # NOTE: at load, once per tensor
            raise CheckpointError(f"FP8 scale {self.scale!r} holds a value that is not finite")
        return s

    def dequantize(self, q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        """``W = q * s`` in float32, ``[N, K]``: the format's own dequantization."""
        s = self._scale(scale)
        if self.scheme.strategy == "block" and self.scheme.block is not None:
            (bn, bk), (n, k) = self.scheme.block, q.shape
            s = s.repeat_interleave(bn, 0)[:n].repeat_interleave(bk, 1)[:, :k]
        else:
            s = s.reshape(-1, 1)  # NOTE: [N, 1] per row, [1, 1] for the tensor
        return q.float() * s

    def rows(self, q: torch.Tensor, scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """graphrt's FP8 weight: ``(q [N, K] e4m3, scale [N] float32)``. Channel and tensor
        scales as stored (exact); block scales requantized per row from :meth:`dequantize`."""
        if self.scheme.strategy == "block":
            return fp8_gemm.quantize(self.dequantize(q, scale))
        return q, self._scale(scale).reshape(-1).expand(q.shape[0]).contiguous()


def fp8_weights(headers: Mapping[str, tuple[str, Shape]], scheme: FP8Scheme) -> dict[str, FP8Weight]:
    """The FP8 weights among ``headers`` (name → (safetensors dtype, shape)) by name; ``ValueError``
    naming an FP8 tensor that is not a 2-D ``.weight``, or whose scale is missing or misshapen."""
    out: dict[str, FP8Weight] = {}
    for name, (dtype, shape) in headers.items():
        if dtype != STORED:
            continue
        scale = f"{name}{scheme.suffix.removeprefix('weight')}"
        if not name.endswith(".weight") or len(shape) != 2:
            raise ValueError(f"FP8 tensor {name!r} of shape {list(shape)} is not a 2-D projection weight")
        if scale not in headers:
            raise ValueError(
                f"FP8 weight {name!r} has no {scale!r} ({scheme.method}, {scheme.strategy} scales)"
            )
        weight = FP8Weight(scale, tuple(shape), tuple(headers[scale][1]), scheme)
        fault = weight.check()
        if fault is not None:
            raise ValueError(f"FP8 weight {name!r} ({scheme.method}, {scheme.strategy} scales): {fault}")
        out[name] = weight
    return out


def companions(name: str) -> tuple[str, ...]:
    """The tensors stored beside FP8 weight ``name`` that graphrt does not load as tensors: its
    scales and its activation scale (weight-only FP8: activations are never quantized)."""
    base = name.removesuffix("weight")
    return (f"{base}weight_scale", f"{base}weight_scale_inv", f"{base}input_scale")
