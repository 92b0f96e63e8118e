"""One registry of attention backends for every attention kind, in an explicit preference order.

A backend registers under its kind (``"mha"``: paged MHA/GQA over a :class:`PagedKVCache`;
``"sparse_mla"``: DSA over an :class:`MLAKVCache`) with an availability test. Selection
walks :data:`PREFERENCE`, never import order; error messages list what is available.
Sparse-MLA backends need the cache's ``layout`` and ``num_heads`` (passed as keywords);
MHA backends need nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

#: kind -> backend names, most preferred first. The torch reference (the oracle) is last.
PREFERENCE: dict[str, tuple[str, ...]] = {
    "mha": ("fa3", "reference"),
    "sparse_mla": ("flashmla", "flashmla-schedmeta", "reference"),
}

LABELS = {"mha": "attention backend", "sparse_mla": "sparse-MLA backend"}


@dataclass(frozen=True, slots=True)
class BackendEntry:
    """``available(device, **need)`` says whether it runs here; ``factory(**need)`` builds it."""

    available: Callable[..., bool]
    factory: Callable[..., Any]


_REGISTRY: dict[tuple[str, str], BackendEntry] = {}


def register(kind: str, name: str, available: Callable[..., bool]) -> Callable[[Any], Any]:
    """Class decorator: register ``factory`` as backend ``name`` of ``kind``."""
    if name not in PREFERENCE.get(kind, ()):
        raise ValueError(f"backend {name!r} of kind {kind!r} is not in PREFERENCE: add it there")

    def wrap(factory: Any) -> Any:
        assert (kind, name) not in _REGISTRY, f"{kind} backend {name} registered twice"
        _REGISTRY[(kind, name)] = BackendEntry(available, factory)
        return factory

    return wrap


def known_backends(kind: str = "mha") -> list[str]:
    """Registered backends of ``kind`` in preference order."""
    return [name for name in PREFERENCE[kind] if (kind, name) in _REGISTRY]


def available_backends(device: torch.device, kind: str = "mha", **need: Any) -> list[str]:
    """Backends of ``kind`` usable on ``device`` (with ``need``), most preferred first."""
    return [n for n in known_backends(kind) if _REGISTRY[(kind, n)].available(device, **need)]


def select_backend(name: str | None, device: torch.device, kind: str = "mha", **need: Any) -> Any:
    """The named backend, or the most preferred available one.

    Raises ``ValueError`` naming the backend and listing the known or available ones.
    """
    usable = available_backends(device, kind, **need)
    name = name or usable[0]
    label = LABELS[kind]
    if (kind, name) not in _REGISTRY:
        raise ValueError(f"unknown {label} {name!r}; known: {', '.join(known_backends(kind))}")
    if name not in usable:
        cache = need.get("layout") or str(need.get("dtype", "")).removeprefix("torch.")
        where = f"{device}" + (f" with a {cache} KV cache" if cache else "")
        raise ValueError(f"{label} {name!r} is not available on {where}; available: {', '.join(usable)}")
    # NOTE: ``dtype`` only decides availability; factories take the kind's build arguments.
    return _REGISTRY[(kind, name)].factory(**{k: v for k, v in need.items() if k != "dtype"})
