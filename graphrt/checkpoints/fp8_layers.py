"""Which layers of a model built for an FP8 checkpoint keep its weights in FP8.

A projection graphrt can run in FP8 (:func:`graphrt.models.quantize.quantizable`: attention
q/k/v and o, the dense MLP's gate/up and down) holds the checkpoint's e4m3 weight when every
checkpoint tensor it is loaded from is FP8 (a fused qkv needs q, k and v in FP8); any other FP8
weight (routed experts, dense-MLA projections, a layer fused with a bf16 one) is dequantized to
the model dtype at load.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from torch import nn

from graphrt.checkpoints.fp8 import FP8Weight
from graphrt.checkpoints.slot import Shape, Slot
from graphrt.models.quantize import hold_fp8, quantizable


class FP8Source(Protocol):
    """A tensor source that can keep FP8 weights in FP8 (:class:`SafetensorsDir`)."""

    fp8: dict[str, FP8Weight]

    def hold(self, names: set[str]) -> dict[str, Shape]: ...


def hold_layers(model: nn.Module, expected: Mapping[str, Slot], source: FP8Source) -> dict[str, Shape]:
    """Turn the layers of ``model`` (on the meta device) that keep FP8 into FP8 holders
    (:func:`~graphrt.models.quantize.hold_fp8`) and tell ``source``; returns the per-row scale
    tensors those layers now expect (name → ``[N]``), empty when none is held."""
    if not source.fp8:
        return {}
    names_of: dict[str, list[str]] = {}
    for name, slot in expected.items():
        names_of.setdefault(slot.param, []).append(name)
    held: set[str] = set()
    paths = {id(m): p for p, m in model.named_modules()}
    for layer in quantizable(model):
        names = names_of.get(f"{paths[id(layer)]}.weight", [])
        if names and all(
            n in source.fp8 and expected[n].expect is None and expected[n].index is None for n in names
        ):
            hold_fp8(layer)
            held.update(names)
    return source.hold(held)
