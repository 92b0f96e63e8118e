"""Small tensors for the emulated engine's tests."""

from __future__ import annotations

from typing import Any

import torch


def tensor(values: Any, device: torch.device, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.tensor(values, dtype=dtype, device=device)
