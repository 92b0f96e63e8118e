"""The attention-backend contract and selection by availability."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import torch

from graphrt.metadata import StepMetadata


class AttentionBackend(Protocol):
    """Paged attention over the KV cache for one layer.

    ``forward`` takes ``q [num_tokens, num_q_heads, head_dim]`` and the layer's caches
    ``[num_pages, page_size, num_kv_heads, head_dim]`` and returns
    ``[num_tokens, num_q_heads, head_dim]`` in ``q``'s dtype. Query token ``i`` of request
    ``b`` sits at position ``cache_seqlens[b] - q_len_b + i`` and attends causally; with
    ``window`` it sees keys ``position - window … position`` only (FA3 ``window_size=(w, 0)``).
    """

    name: str

    def forward(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        meta: StepMetadata,
        scale: float,
        window: int | None = None,
    ) -> torch.Tensor: ...

    def host_scalars(self) -> dict[str, Any]:
        """Python values this backend hands to its kernels beyond the metadata's."""
        ...


#: name -> (is available on this device?, factory). Ordered by preference.
_REGISTRY: dict[str, tuple[Callable[[torch.device], bool], Callable[[], AttentionBackend]]] = {}


def register(name: str, available: Callable[[torch.device], bool]):
    def wrap(factory: Callable[[], AttentionBackend]) -> Callable[[], AttentionBackend]:
        assert name not in _REGISTRY, f"backend {name} registered twice"
        _REGISTRY[name] = (available, factory)
        return factory

    return wrap


def known_backends() -> list[str]:
    """Every registered backend name, available here or not."""
    return list(_REGISTRY)


def available_backends(device: torch.device) -> list[str]:
    return [name for name, (ok, _) in _REGISTRY.items() if ok(device)]


def select_backend(name: str | None, device: torch.device) -> AttentionBackend:
    """The named backend, or the first available one; errors list what is available."""
    usable = available_backends(device)
    if name is None:
        name = usable[0]
    if name not in _REGISTRY:
        raise ValueError(f"unknown attention backend {name!r}; known: {', '.join(_REGISTRY)}")
    if name not in usable:
        raise ValueError(f"backend {name!r} is not available on {device}; available: {', '.join(usable)}")
    return _REGISTRY[name][1]()
