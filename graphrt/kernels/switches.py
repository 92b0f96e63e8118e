"""Environment switches of the optional Triton kernels (the step update, RoPE + KV store, sampler).

Each kernel has an environment variable: ``1`` (default) runs it on CUDA, ``0`` runs the
torch code it replaces on CUDA too (debugging, A/B timing), ``interpret`` runs it on the CPU
through Triton's interpreter (needs ``TRITON_INTERPRET=1`` before triton is imported; tests
only: the emulated capture engine cannot record a Triton launch).
"""

from __future__ import annotations

import os

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
