"""Weight quantization of a built model: which layers, and the names the API takes.

``"fp8"``: every column- and row-parallel projection (attention q/k/v and o, the dense MLP's
gate/up and down) holds its rank's weight as e4m3 rows with float32 per-row scales
(:mod:`graphrt.kernels.fp8_gemm`); the embedding, the LM head and the norms keep the model's
dtype. Layers of other kinds (dense-MLA projections, routed experts) are not quantized.
"""

from __future__ import annotations

import torch
from torch import nn

from graphrt.kernels.fp8_gemm import FP8
from graphrt.models.parallel import (
    ATTRS,
    ColumnParallelLinear,
    ParallelLMHead,
    RowParallelLinear,
    Shard,
    whole,
)

#: ``quantization`` values the loaders and the CLI take (``None``: the checkpoint's own dtype).
QUANTIZATIONS = ("fp8",)


def check_quantization(quantization: str | None) -> None:
    """Raise ``ValueError`` naming ``quantization`` and the supported names when it is unknown."""
    if quantization is not None and quantization not in QUANTIZATIONS:
        raise ValueError(
            f"quantization {quantization!r} is not supported; supported: {', '.join(QUANTIZATIONS)} (or None)"
        )


def quantizable(model: nn.Module) -> list[nn.Module]:
    """The layers ``"fp8"`` quantizes: projections, not the LM head."""
    kinds = (ColumnParallelLinear, RowParallelLinear)
    return [m for m in model.modules() if isinstance(m, kinds) and not isinstance(m, ParallelLMHead)]


def quantize(model: nn.Module, quantization: str | None) -> int:
    """Quantize ``model``'s weights in place as ``quantization`` names; returns the layers changed.

    ``None`` changes nothing. Raises ``ValueError`` for an unknown name, or for a model with no
    layer the scheme quantizes (naming the model's class).
    """
    check_quantization(quantization)
    if quantization is None:
        return 0
    layers = quantizable(model)
    if not layers:
        raise ValueError(
            f"quantization {quantization!r}: {type(model).__name__} has no layer it quantizes "
            "(column- and row-parallel projections of Llama-family decoders)"
        )
    # NOTE: a layer already FP8 (loaded from an FP8 checkpoint) is not quantized twice
    todo = [layer for layer in layers if layer.weight.dtype != FP8]
    for layer in todo:
        layer.quantize_fp8()
    return len(todo)


def scale_shard(weight: Shard) -> Shard:
    """The per-row scale's shard of a weight shard: its rows, or all rows for a column shard."""
    rows = weight.shape[0]
    if weight.dim != 0:
        return whole((rows,))
    return Shard(0, weight.start, weight.stop, weight.dest, weight.size, (rows,))


def hold_fp8(layer: nn.Module) -> None:
    """Make ``layer`` (a projection of :func:`quantizable`, on the meta device) hold an FP8
    checkpoint's weight: ``weight`` e4m3 and ``weight_scale`` a float32 ``[rows]`` parameter
    (loaders fill it with the rows of each weight shard: :func:`scale_shard`), so both load; :func:`release_fp8`
    makes the scale a buffer again once loaded, as :meth:`quantize_fp8` leaves it."""
    old = layer.weight
    weight = nn.Parameter(torch.empty(old.shape, dtype=FP8, device=old.device), requires_grad=False)
    for attr in ATTRS:
        setattr(weight, attr, getattr(old, attr))
    layer.weight = weight
    scale = nn.Parameter(torch.empty(old.shape[0], device=old.device), requires_grad=False)
    scale.full_shape = (old.full_shape[0],)  # type: ignore[attr-defined]
    layer.weight_scale = scale


def release_fp8(model: nn.Module) -> None:
    """Every :func:`hold_fp8` layer's ``weight_scale`` parameter made a plain buffer."""
    for layer in quantizable(model):
        scale = layer._parameters.pop("weight_scale", None)
        if scale is not None:
            layer.register_buffer("weight_scale", scale.data, persistent=False)
