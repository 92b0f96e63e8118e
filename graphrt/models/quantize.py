"""Weight quantization of a built model: which layers, and the names the API takes.

``"fp8"``: every column- and row-parallel projection (attention q/k/v and o, the dense MLP's
gate/up and down) holds its rank's weight as e4m3 rows with float32 per-row scales
(:mod:`graphrt.kernels.fp8_gemm`); the embedding, the LM head and the norms keep the model's
dtype. Layers of other kinds (dense-MLA projections, routed experts) are not quantized.
"""

from __future__ import annotations

from torch import nn

from graphrt.models.parallel import ColumnParallelLinear, ParallelLMHead, RowParallelLinear

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
    for layer in layers:
        layer.quantize_fp8()
    return len(layers)
