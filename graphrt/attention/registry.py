"""One table of attention backends per attention kind, in preference order, loaded lazily.

A row maps a backend name to ``"module:Class"``: nothing registers by being imported, and a
backend's module (with its kernel library) is imported only when the backend is asked about.
A class offers ``available(device, **need) -> bool`` and is built as ``Class(**need)``, where
``need`` is what the kind passes: MHA/GQA (``"mha"``) the cache ``dtype``; dense MLA
(``"mla"``) the cache ``dtype``, ``rope_dim`` and ``kv_lora_rank``; sparse MLA
(``"sparse_mla"``) the cache ``layout``, ``num_heads`` and ``index_topk``. Selection walks the
table in order; error messages list what is known or available.
"""

from __future__ import annotations

import importlib
from typing import Any

import torch

#: kind -> backend name -> "module:Class", most preferred first; the torch reference (the
#: oracle) last. Adding a backend is one file plus one row here (or :func:`add_backend`).
BACKENDS: dict[str, dict[str, str]] = {
    "mha": {
        "fa3": "graphrt.attention.fa3:FA3Backend",
        "reference": "graphrt.attention.reference:ReferenceBackend",
    },
    # NOTE: dense MLA is FA3 / the reference with ``qv`` (the absorbed q_nope against the latents).
    "mla": {
        "fa3": "graphrt.attention.fa3_mla:FA3MLABackend",
        "reference": "graphrt.attention.reference:ReferenceBackend",
    },
    "sparse_mla": {
        "flashmla": "graphrt.attention.flashmla:FlashMLABackend",
        "flashmla-schedmeta": "graphrt.attention.flashmla:FlashMLASchedMetaBackend",
        "reference": "graphrt.attention.mla:SparseMLAReference",
    },
}

LABELS = {"mha": "attention backend", "mla": "MLA backend", "sparse_mla": "sparse-MLA backend"}


def add_backend(kind: str, name: str, target: str, *, first: bool = False) -> None:
    """Add row ``name -> target`` (``"module:Class"``) to ``kind``'s table, last or ``first``."""
    if kind not in BACKENDS:
        raise ValueError(f"unknown attention kind {kind!r}; known: {', '.join(BACKENDS)}")
    module, _, attr = target.partition(":")
    if not module or not attr:
        raise ValueError(f"backend target must be 'module:Class', got {target!r}")
    rows = {k: v for k, v in BACKENDS[kind].items() if k != name}
    BACKENDS[kind] = {name: target, **rows} if first else {**rows, name: target}


def backend_class(kind: str, name: str) -> Any:
    """The class of backend ``name`` of ``kind`` (its module imported now)."""
    rows = BACKENDS[kind]
    if name not in rows:
        raise ValueError(f"unknown {LABELS[kind]} {name!r}; known: {', '.join(rows)}")
    module, _, attr = rows[name].partition(":")
    return getattr(importlib.import_module(module), attr)


def known_backends(kind: str = "mha") -> list[str]:
    """Backends of ``kind`` in preference order."""
    return list(BACKENDS[kind])


def available_backends(device: torch.device, kind: str = "mha", **need: Any) -> list[str]:
    """Backends of ``kind`` usable on ``device`` (with ``need``), most preferred first."""
    return [n for n in BACKENDS[kind] if backend_class(kind, n).available(device, **need)]


def select_backend(name: str | None, device: torch.device, kind: str = "mha", **need: Any) -> Any:
    """The named backend, or the most preferred available one, built with ``need``.

    Raises ``ValueError`` naming the backend and listing the known or available ones.
    """
    label = LABELS[kind]
    if name is not None and name not in BACKENDS[kind]:
        raise ValueError(f"unknown {label} {name!r}; known: {', '.join(BACKENDS[kind])}")
    usable = available_backends(device, kind, **need)
    name = name or usable[0]
    if name not in usable:
        cache = need.get("layout") or str(need.get("dtype", "")).removeprefix("torch.")
        where = f"{device}" + (f" with a {cache} KV cache" if cache else "")
        raise ValueError(f"{label} {name!r} is not available on {where}; available: {', '.join(usable)}")
    return backend_class(kind, name)(**need)
