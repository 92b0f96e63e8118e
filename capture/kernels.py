"""Kernel lists read from a CUDA graph's debug dump (Graphviz DOT from cudaGraphDebugDotPrint).

Symbols are demangled with ``cxxfilt`` (the C++ runtime's ``__cxa_demangle``), keeping the full
template arguments: that is what tells an FA3 ``cutlass::device_kernel<flash::FlashAttnFwdSm90<…>>``
from any other CUTLASS kernel. Identical kernels (same name) are grouped with a count.
"""

from __future__ import annotations

import functools
import logging
import re
from collections.abc import Iterable, Mapping
from dataclasses import replace

from graphrt.capture.graph import KernelCount

log = logging.getLogger(__name__)

_NODE = re.compile(r'label="\{(?P<type>[A-Z_]+)\n(?P<body>.*?)\}"\];', re.S)
_ANON = "(anonymous namespace)"
_KERNEL = re.compile(r"\{ID \| \d+ \(topoId: \d+\) \| (?P<name>[^\\|}]+)\\<\\<\\<(?P<launch>.*?)\\>\\>\\>")


@functools.cache
def _cxa_demangle(symbol: str) -> str | None:
    """``cxxfilt.demangle(symbol)``, or None when the symbol or the C++ runtime library is missing."""
    try:
        import cxxfilt

        return cxxfilt.demangle(symbol)
    except ImportError:
        log.warning("cxxfilt is not installed; kernel names are shown without template arguments")
    except Exception as err:  # NOTE: cxxfilt.LibraryNotFound, InvalidName, InternalError
        log.debug("cannot demangle %s: %s", symbol, err)
    return None


def kernel_name(signature: str) -> str:
    """A demangled signature without its return type and parameter list.

    ``void at::native::k<int, 4>(float*, int)`` → ``at::native::k<int, 4>``. Template arguments
    (which may hold parentheses and spaces, e.g. lambdas) are kept whole.
    """
    text = signature.replace(_ANON, "\0")  # NOTE: its parenthesis and space are part of the name
    depth, end = 0, len(text)
    for i, ch in enumerate(text):
        depth += (ch == "<") - (ch == ">")
        if ch == "(" and depth == 0:
            end = i
            break
    head, start = text[:end].strip(), 0
    depth = 0
    for i, ch in enumerate(head):  # NOTE: the return type ends at the last top-level space
        depth += (ch == "<") - (ch == ">")
        if ch == " " and depth == 0:
            start = i + 1
    return (head[start:] or text).replace("\0", _ANON)


def _fallback(symbol: str) -> str:
    """Qualified name without template arguments, parsed by hand (no C++ runtime needed)."""
    i = 3 if symbol.startswith("_ZN") else 2
    parts = []
    while i < len(symbol) and symbol[i].isdigit():
        j = i
        while symbol[j].isdigit():
            j += 1
        n = int(symbol[i:j])
        parts.append(symbol[j : j + n])
        i = j + n
        if not symbol.startswith("_ZN"):
            break
    return "::".join(parts) or symbol


def demangle(symbol: str) -> str:
    """Qualified name of an Itanium-mangled symbol, template arguments included.

    ``_ZN2at6native4workIiEEvv`` → ``at::native::work<int>``. Plain (``extern "C"``, Triton)
    names are returned unchanged; without ``cxxfilt`` the templates are dropped.
    """
    if not symbol.startswith("_Z"):
        return symbol
    full = _cxa_demangle(symbol)
    return kernel_name(full) if full else _fallback(symbol)


def short_name(name: str, depth: int = 2) -> str:
    """``name`` with template arguments nested deeper than ``depth`` elided: ``a<b<…>>`` at depth 1."""
    out, level = [], 0
    for ch in name:
        if ch == "<":
            level += 1
            if level == depth + 1:
                out.append("<…")
            if level > depth:
                continue
        elif ch == ">":
            level -= 1
            if level > depth:
                continue
        elif level > depth:
            continue
        out.append(ch)
    return "".join(out)


def split_launch(launch: str) -> tuple[str, str, str]:
    """``"6,{32,16},0"`` → ``("6", "{32,16}", "0")`` (commas inside braces kept)."""
    parts, depth, cur = [], 0, ""
    for ch in launch:
        depth += (ch == "{") - (ch == "}")
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    parts.append(cur)
    grid, block, smem = (*parts, "", "", "")[:3]
    return grid, block, smem


def _joined(values: Iterable[str]) -> str:
    return " | ".join(dict.fromkeys(v for v in values if v))


def group(launches: Iterable[tuple[str, str]]) -> tuple[KernelCount, ...]:
    """One :class:`KernelCount` per name, in first-seen order; distinct launch dims joined by ``|``.

    ``launches`` are ``(name, "grid,block,smem")`` pairs, one per graph node.
    """
    seen: dict[str, list[str]] = {}
    for name, launch in launches:
        seen.setdefault(name, []).append(launch)
    kernels = []
    for name, dims in seen.items():
        parts = [split_launch(d) for d in dims if d]
        launch = ",".join(_joined(p[i] for p in parts) for i in range(3)) if parts else ""
        kernels.append(KernelCount(name, len(dims), launch))
    return tuple(kernels)


def parse_dot(text: str) -> tuple[int, tuple[KernelCount, ...]]:
    """Number of nodes and the kernels (demangled, grouped by name, with launch dims) of a DOT dump."""
    nodes = 0
    found: list[tuple[str, str]] = []
    for node in _NODE.finditer(text):
        nodes += 1
        if node["type"] != "KERNEL":
            found.append((node["type"].lower(), ""))
            continue
        m = _KERNEL.search(node["body"])
        name = demangle(m["name"].strip()) if m else "kernel"
        found.append((name, m["launch"].replace("\\", "") if m else ""))
    return nodes, group(found)


def with_times(kernels: tuple[KernelCount, ...], times_us: Mapping[str, float]) -> tuple[KernelCount, ...]:
    """``kernels`` with ``time_us`` from ``times_us`` (GPU µs per name, summed over its launches).

    Profiler names are full signatures (``void k<…>(args)``) or mangled symbols; both are reduced
    to :func:`kernel_name` before matching. Kernels without a match keep ``time_us=None``.
    """
    by_name: dict[str, float] = {}
    for raw, us in times_us.items():
        key = demangle(raw) if raw.startswith("_Z") else kernel_name(raw)
        key = next((n for n in ("memset", "memcpy") if raw.lower().startswith(n)), key)
        by_name[key] = by_name.get(key, 0.0) + us
    return tuple(replace(k, time_us=by_name.get(k.name, k.time_us)) for k in kernels)
