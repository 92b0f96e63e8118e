"""One table of attention backends per attention kind, in preference order, loaded lazily.

A row maps a backend name to ``"module:Class"``, or to a tuple of row names: a dispatch, where
each step goes to the first part that takes it (:mod:`graphrt.attention.dispatch`). Nothing
registers by being imported, and a backend's module (with its kernel library) is imported only
when the backend is asked about. A class offers ``available(device, **need) -> bool`` and
``graph_support`` (what it serves) and is built as ``Class(**need)``, where ``need`` is what the
kind passes: MHA/GQA (``"mha"``) the cache ``dtype``; dense MLA (``"mla"``) the cache ``dtype``,
``rope_dim`` and ``kv_lora_rank``; sparse MLA (``"sparse_mla"``) the cache ``layout``,
``num_heads`` and ``index_topk``. Selection walks the table in order and skips a backend that
cannot serve the runtime's :class:`~graphrt.attention.capabilities.Needs`; a named backend that
cannot is refused, naming both. Error messages list what is known or available.
"""

from __future__ import annotations

import importlib
from typing import Any

import torch

from graphrt.attention.capabilities import GraphSupport, Needs
from graphrt.attention.dispatch import Dispatch

#: kind -> backend name -> "module:Class" or a dispatch of rows, most preferred first; the
#: torch reference (the oracle) before the rows that are parts of others. Adding a backend is
#: one file plus one row here (or :func:`add_backend`).
BACKENDS: dict[str, dict[str, str | tuple[str, ...]]] = {
    "mha": {
        # NOTE: FA3 yields the decode steps where its CTAs would leave the GPU short.
        "fa3": ("split_decode", "fa3_kernel"),
        "reference": "graphrt.attention.reference:ReferenceBackend",
        "split_decode": "graphrt.attention.split_decode.backend:SplitDecodeBackend",
        "fa3_kernel": "graphrt.attention.fa3:FA3Backend",
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


def add_backend(kind: str, name: str, target: str | tuple[str, ...], *, first: bool = False) -> None:
    """Add row ``name -> target`` (``"module:Class"`` or a dispatch of row names) to ``kind``'s
    table, last or ``first``."""
    if kind not in BACKENDS:
        raise ValueError(f"unknown attention kind {kind!r}; known: {', '.join(BACKENDS)}")
    if isinstance(target, tuple):
        unknown = [p for p in target if p not in BACKENDS[kind]]
        if not target or unknown:
            raise ValueError(f"a dispatch row lists rows of {kind!r}; unknown: {unknown or 'none given'}")
    else:
        module, _, attr = target.partition(":")
        if not module or not attr:
            raise ValueError(f"backend target must be 'module:Class', got {target!r}")
    rows = {k: v for k, v in BACKENDS[kind].items() if k != name}
    BACKENDS[kind] = {name: target, **rows} if first else {**rows, name: target}


def backend_class(kind: str, name: str) -> Any:
    """The class of backend ``name`` of ``kind`` (its module imported now); a dispatch's base's."""
    rows = BACKENDS[kind]
    if name not in rows:
        raise ValueError(f"unknown {LABELS[kind]} {name!r}; known: {', '.join(rows)}")
    target = rows[name]
    if isinstance(target, tuple):
        return backend_class(kind, target[-1])
    module, _, attr = target.partition(":")
    return getattr(importlib.import_module(module), attr)


def graph_support(kind: str, name: str) -> GraphSupport:
    """What backend ``name`` of ``kind`` declares it serves (a dispatch: its base's)."""
    return backend_class(kind, name).graph_support


def known_backends(kind: str = "mha") -> list[str]:
    """Backends of ``kind`` in preference order."""
    return list(BACKENDS[kind])


def dispatch_parts(kind: str = "mha") -> set[str]:
    """Rows of ``kind`` that are parts of a dispatch row (they also serve on their own)."""
    return {p for target in BACKENDS[kind].values() if isinstance(target, tuple) for p in target}


def available_backends(device: torch.device, kind: str = "mha", **need: Any) -> list[str]:
    """Backends of ``kind`` usable on ``device`` (with ``need``), most preferred first."""
    return [n for n in BACKENDS[kind] if backend_class(kind, n).available(device, **need)]


def build_backend(kind: str, name: str, device: torch.device, **need: Any) -> Any:
    """Backend ``name`` of ``kind`` built with ``need``; a dispatch of its available parts."""
    target = BACKENDS[kind][name]
    if not isinstance(target, tuple):
        return backend_class(kind, name)(**need)
    parts = [p for p in target[:-1] if backend_class(kind, p).available(device, **need)]
    return Dispatch(name, tuple(build_backend(kind, p, device, **need) for p in (*parts, target[-1])))


def select_backend(
    name: str | None, device: torch.device, kind: str = "mha", needs: Needs | None = None, **need: Any
) -> Any:
    """The named backend, or the most preferred available one that serves ``needs``, built
    with ``need``.

    Raises ``ValueError`` naming the backend and listing the known or available ones, or why
    the named one cannot serve ``needs``.
    """
    label = LABELS[kind]
    if name is not None and name not in BACKENDS[kind]:
        raise ValueError(f"unknown {label} {name!r}; known: {', '.join(BACKENDS[kind])}")
    usable = available_backends(device, kind, **need)
    if name is not None and name not in usable:
        cache = need.get("layout") or str(need.get("dtype", "")).removeprefix("torch.")
        where = f"{device}" + (f" with a {cache} KV cache" if cache else "")
        raise ValueError(f"{label} {name!r} is not available on {where}; available: {', '.join(usable)}")
    refusals = {n: refusal(kind, n, needs) for n in ([name] if name else usable)}
    chosen = next((n for n, why in refusals.items() if why is None), None)
    if chosen is None:
        raise ValueError(
            "; ".join(str(why) for why in refusals.values())
            + ": change capture_modes / buckets or pick another backend"
        )
    return build_backend(kind, chosen, device, **need)


def refusal(kind: str, name: str, needs: Needs | None) -> str | None:
    """Why backend ``name`` of ``kind`` cannot serve ``needs`` (None: it can, or no needs)."""
    return None if needs is None else graph_support(kind, name).refusal(name, needs)
