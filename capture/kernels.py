"""Kernel lists read from a CUDA graph's debug dump (Graphviz DOT from cudaGraphDebugDotPrint)."""

from __future__ import annotations

import re
from collections import Counter

from graphrt.capture.graph import KernelCount

_NODE = re.compile(r'label="\{(?P<type>[A-Z_]+)\n(?P<body>.*?)\}"\];', re.S)
_KERNEL = re.compile(r"\{ID \| \d+ \(topoId: \d+\) \| (?P<name>[^\\|}]+)\\<\\<\\<(?P<launch>.*?)\\>\\>\\>")


def demangle(symbol: str) -> str:
    """Qualified name of an Itanium-mangled symbol (``_ZN2at6native4workE...`` → ``at::native::work``).

    Template arguments are dropped: the list is for reading, the raw symbol stays available.
    """
    if not symbol.startswith("_Z"):
        return symbol
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


def parse_dot(text: str) -> tuple[int, tuple[KernelCount, ...]]:
    """Number of nodes and the kernels (demangled, counted, with launch dims) of a DOT dump."""
    counts: Counter[tuple[str, str]] = Counter()
    nodes = 0
    for node in _NODE.finditer(text):
        nodes += 1
        if node["type"] != "KERNEL":
            counts[(node["type"].lower(), "")] += 1
            continue
        m = _KERNEL.search(node["body"])
        name = demangle(m["name"].strip()) if m else "kernel"
        launch = m["launch"].replace("\\", "") if m else ""
        counts[(name, launch)] += 1
    kernels = tuple(KernelCount(n, c, launch) for (n, launch), c in counts.items())
    return nodes, kernels
