"""Environment switches of the optional Triton kernels (the step update, RoPE + KV store, sampler).

Each kernel has an environment variable: ``1`` (default) runs it on CUDA, ``0`` runs the
torch code it replaces on CUDA too (debugging, A/B timing), ``interpret`` runs it on the CPU
through Triton's interpreter (needs ``TRITON_INTERPRET=1`` before triton is imported; tests
only: the emulated capture engine cannot record a Triton launch).
"""

from __future__ import annotations

import contextlib
import contextvars
import os
from collections.abc import Iterator

import torch

try:  # NOTE: optional: the CPU build of torch may come without a usable Triton
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - exercised on machines without triton
    triton = None
    tl = None


def triton_enabled(env: str, device: torch.device) -> bool:
    """Whether the Triton kernel switched by ``env`` runs for tensors on ``device``."""
    flag = os.environ.get(env, "1")
    if flag == "0" or triton is None:
        return False
    if device.type == "cuda":
        return True
    return flag == "interpret" and os.environ.get("TRITON_INTERPRET") == "1"


#: The PDL switch of the skinny GEMM, the fused prologues and the split decode attention
#: (``GRAPHRT_SKINNY_PDL=0``: launched without PDL); the sampler has its own.
KERNELS_PDL_ENV = "GRAPHRT_SKINNY_PDL"


def pdl_enabled(env: str, device: torch.device) -> bool:
    """Whether a Triton kernel launches with programmatic dependent launch on ``device``: SM90+
    CUDA devices (never the interpreter) unless its switch ``env`` is ``0``."""
    if device.type != "cuda" or os.environ.get(env, "1") == "0":
        return False
    return torch.cuda.get_device_capability(device)[0] >= 9


#: Whether the step being traced runs batch-invariant kernels (``RuntimeConfig.deterministic``):
#: set by the runtime around each model forward (eager, warm-up and capture alike), read by the
#: GEMM and attention dispatch. A context variable, so two engines in one process keep their own.
_BATCH_INVARIANT: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "graphrt_batch_invariant", default=False
)


def batch_invariant_on() -> bool:
    """Whether the forward now running must give each row the same bits whatever its batch."""
    return _BATCH_INVARIANT.get()


@contextlib.contextmanager
def batch_invariant(on: bool) -> Iterator[None]:
    """Run the enclosed forward with batch-invariant kernels (``on``) or the fastest ones."""
    token = _BATCH_INVARIANT.set(on)
    try:
        yield
    finally:
        _BATCH_INVARIANT.reset(token)
