"""What a result was measured on: device, torch, sgl-kernel, triton."""

from __future__ import annotations

import importlib.metadata
import platform

import torch


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def sgl_kernel_version() -> str | None:
    """The importable sgl-kernel's version, or None when it does not import."""
    try:
        import sgl_kernel

        return getattr(sgl_kernel, "__version__", None) or _version("sglang-kernel")
    except (ImportError, OSError):
        return None


def environment(device: torch.device) -> dict[str, str | None]:
    """Device name and torch / CUDA / sgl-kernel / triton / Python versions."""
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu"
    return {
        "device": name,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "sgl_kernel": sgl_kernel_version(),
        "triton": _version("triton"),
        "python": platform.python_version(),
    }
