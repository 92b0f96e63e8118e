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
