"""Model-code snippets a CUDA stream capture rejects (or accepts), shared by both engines' tests.

``python -m tests.support.capture_ops NAME`` captures one snippet with the CUDA engine in a fresh
process (a failed capture may leave the CUDA context unusable) and prints ``refused`` or ``ok``.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Inputs:
    x: torch.Tensor  # [6] float
    mask: torch.Tensor  # [6] bool
    counts: torch.Tensor  # [6] int64
    host: torch.Tensor  # [6] float, on the CPU

    @classmethod
    def on(cls, device: torch.device) -> Inputs:
        x = torch.arange(6, dtype=torch.float32, device=device)
        counts = torch.tensor([1, 2, 0, 1, 1, 1], device=device)
        return cls(x, x > 2, counts, torch.zeros(6))


def _set_mask(t: Inputs) -> torch.Tensor:
    y = t.x.clone()
    y[t.mask] = torch.ones(3, device=t.x.device)
    return y


def _set_mask_scalar(t: Inputs) -> torch.Tensor:
    y = t.x.clone()
    y[t.mask] = 1.0
    return y


#: name -> (snippet, the op the error names)
REFUSED: dict[str, tuple[Callable[[Inputs], object], str]] = {
    "item": (lambda t: t.x.sum().item(), "_local_scalar_dense"),
    "tolist": (lambda t: t.x.tolist(), "Tensor.tolist"),
    "cpu": (lambda t: t.x.cpu(), "Tensor.cpu"),
    "numpy": (lambda t: t.x.numpy(), "Tensor.numpy"),
    "to_cpu": (lambda t: t.x.to("cpu"), r"Tensor.to\(cpu\)"),
    "to_cpu_kwarg": (lambda t: t.x.to(device="cpu"), r"Tensor.to\(cpu\)"),
    "get_mask": (lambda t: t.x[t.mask], "aten.index.Tensor"),
    "set_mask": (_set_mask, "aten.index_put_"),
    "nonzero": (lambda t: t.mask.nonzero(), "aten.nonzero"),
    "where_one_arg": (lambda t: torch.where(t.mask), "aten.nonzero"),
    "repeat_interleave": (lambda t: torch.repeat_interleave(t.x, t.counts), "aten.repeat_interleave.Tensor"),
    "repeat_interleave_counts": (lambda t: t.counts.repeat_interleave(t.counts), "aten.repeat_interleave"),
    "bincount": (lambda t: torch.bincount(t.counts), "aten.bincount"),
    "unique": (lambda t: torch.unique(t.counts), "aten._unique2"),
    "unique_dim": (lambda t: torch.unique(t.counts.view(2, 3), dim=0), "aten.unique_dim"),
    "bool": (lambda t: bool(t.x.sum() > 0), "aten._local_scalar_dense|aten.is_nonzero"),
    "copy_to_host": (lambda t: t.host.copy_(t.x), "aten.copy_"),  # NOTE: a D2H copy only from a GPU
}
#: Snippets that touch the host only when the inputs live on a GPU.
DEVICE_ONLY = frozenset({"copy_to_host"})
#: Snippets with no host sync and fixed shapes: both engines capture them.
ALLOWED: dict[str, Callable[[Inputs], object]] = {
    "masked_fill": lambda t: t.x.masked_fill(t.mask, 1.0),
    "set_mask_scalar": _set_mask_scalar,  # NOTE: CUDA turns it into masked_fill (measured on the H100)
    "repeat_interleave_output_size": lambda t: torch.repeat_interleave(t.x, t.counts, output_size=6),
    "to_own_device": lambda t: t.x.to(t.x.device),
    "to_dtype": lambda t: t.x.to(torch.float64),
    "index_with_ints": lambda t: t.x[t.counts],
    "where_three_args": lambda t: torch.where(t.mask, t.x, 0.0),
}


def probe(name: str) -> str:
    """Capture one snippet with the CUDA engine: ``refused`` or ``ok``."""
    from graphrt.capture.cuda import CudaEngine

    device = torch.device("cuda")
    t = Inputs.on(device)
    fn = REFUSED[name][0] if name in REFUSED else ALLOWED[name]
    try:
        CudaEngine(device, record_kernels=False).capture(name, lambda: fn(t), warmup=0)
    except Exception:  # NOTE: CUDA reports a rejected op as RuntimeError, numpy as TypeError
        return "refused"
    return "ok"


if __name__ == "__main__":
    print(probe(sys.argv[1]))
