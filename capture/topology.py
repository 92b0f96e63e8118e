"""Which nodes of a captured graph carry a programmatic (PDL) dependency edge.

A kernel launched with programmatic stream serialization (Triton's ``launch_pdl=True``) inside a
stream capture gets a *programmatic* edge from the kernel before it: it may start its prologue
while that kernel finishes. The node and edge lists come from the CUDA graph itself
(``cudaGraphGetNodes`` / ``cudaGraphGetEdges`` through ``cuda.bindings``, imported only here and
only when a CUDA graph is read); the emulated engine derives the same from its recorded ops.
Nothing of models is known here: an op asks for PDL through a ``bool pdl`` schema argument.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from graphrt.capture.graph import KernelCount
from graphrt.capture.kernels import demangle

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class TopologyNode:
    """One graph node in creation (= launch) order.

    ``name``: the demangled kernel name, the op name (emulated), the node type for other nodes
    (``memset``, ``memcpy``), or ``""`` when names were not read. ``programmatic``: an edge into
    this node is programmatic (it may start before its predecessor has finished).
    """

    name: str
    kernel: bool
    programmatic: bool


@dataclass(frozen=True, slots=True)
class GraphTopology:
    """The nodes of one graph and how many of its dependency edges are programmatic."""

    nodes: tuple[TopologyNode, ...]
    edges: int
    programmatic_edges: int

    @property
    def num_nodes(self) -> int:
        return len(self.nodes)

    @property
    def kernel_nodes(self) -> int:
        return sum(n.kernel for n in self.nodes)

    def pdl_launches(self) -> dict[str, int]:
        """Per node name, how many of its nodes have a programmatic in-edge (names with none left out)."""
        out: dict[str, int] = {}
        for n in self.nodes:
            if n.programmatic:
                out[n.name] = out.get(n.name, 0) + 1
        return out


def build_topology(
    nodes: Sequence[tuple[str, bool]], edges: Iterable[tuple[int, int, bool]]
) -> GraphTopology:
    """A :class:`GraphTopology` from ``(name, is_kernel)`` per node and ``(from, to, programmatic)``
    edges given as node indices."""
    into: set[int] = set()
    total = programmatic = 0
    for _, to, is_programmatic in edges:
        total += 1
        if is_programmatic:
            programmatic += 1
            into.add(to)
    return GraphTopology(
        tuple(TopologyNode(name, kernel, i in into) for i, (name, kernel) in enumerate(nodes)),
        total,
        programmatic,
    )


def with_pdl(kernels: Sequence[KernelCount], topology: GraphTopology | None) -> tuple[KernelCount, ...]:
    """``kernels`` with ``pdl`` set from ``topology`` (matched by name); unchanged without one."""
    if topology is None:
        return tuple(kernels)
    launches = topology.pdl_launches()
    return tuple(replace(k, pdl=min(launches.get(k.name, 0), k.count)) for k in kernels)


# ---- the emulated engine: recorded ops ------------------------------------------------------
@functools.cache
def _pdl_argument(func: Any) -> tuple[int, Any] | None:
    """``(position, default)`` of the op's ``bool pdl`` schema argument, or None."""
    for i, arg in enumerate(func._schema.arguments):
        if arg.name == "pdl" and str(arg.type) == "bool":
            return i, arg.default_value
    return None


def requests_pdl(func: Any, args: tuple, kwargs: dict) -> bool:
    """Whether an op call asks for programmatic dependent launch: its schema has a ``bool pdl``
    argument (graphrt's skinny GEMM and fused prologues) and this call passes True."""
    found = _pdl_argument(func)
    if found is None:
        return False
    i, default = found
    return bool(args[i] if i < len(args) else kwargs.get("pdl", default))


def ops_topology(calls: Sequence[tuple[str, bool]]) -> GraphTopology:
    """The topology of an emulated graph: ``(op name, requests PDL)`` per recorded op, in order.

    The ops replay one after another, so each has one edge from the op before it; that edge is
    programmatic when the op asks for PDL, as a capture on a stream makes it for a kernel.
    """
    edges = [(i - 1, i, pdl) for i, (_, pdl) in enumerate(calls) if i > 0]
    return build_topology([(name, True) for name, _ in calls], edges)


# ---- a CUDA graph: cuda.bindings -------------------------------------------------------------
def cuda_bindings_missing() -> str | None:
    """Why a CUDA graph's topology cannot be read in this process, or None when it can."""
    try:
        from cuda.bindings import driver, runtime  # noqa: F401
    except ImportError as err:
        return f"cuda-python (cuda.bindings) is not importable: {err}"
    return None


def cuda_topology(graph: Any, names: bool = True) -> GraphTopology | None:
    """The topology of a captured ``torch.cuda.CUDAGraph`` (captured with ``keep_graph=True``).

    ``names``: read each kernel node's function name (one driver call per kernel node); else
    names are ``""`` and only the node types and edges are read. Returns None (the reason is
    logged) when ``cuda.bindings`` is missing or the graph cannot be read: the topology is a
    debugging aid, never a reason for a capture to fail.
    """
    why = cuda_bindings_missing()
    if why is None:
        raw = getattr(graph, "raw_cuda_graph", None)
        why = "torch.cuda.CUDAGraph has no raw_cuda_graph()" if raw is None else None
    if why is None:
        try:
            return _read(raw(), names)
        except Exception as err:  # NOTE: cudaError / CUresult failures, or an API of another version
            why = f"{type(err).__name__}: {err}"
    log.debug("graph topology not read: %s", why)
    return None


def _check(result: tuple) -> tuple:
    """``result`` without its leading error code; raises when that code is not success."""
    err, *rest = result
    if _value(err) != 0:
        raise RuntimeError(f"CUDA call failed: {err!r}")
    return tuple(rest)


def _value(enum: Any) -> int:
    """An enum of the bindings (``cudaError_t``, ``CUresult``, ``cudaGraphDependencyType``) as its int."""
    return int(getattr(enum, "value", enum))


def _read(handle: int, names: bool) -> GraphTopology:
    from cuda.bindings import runtime as rt

    graph = rt.cudaGraph_t(init_value=handle)
    (_, count) = _check(rt.cudaGraphGetNodes(graph, 0))
    nodes, _ = _check(rt.cudaGraphGetNodes(graph, count))
    index = {int(n): i for i, n in enumerate(nodes)}
    return build_topology([_node(n, names) for n in nodes], _edges(graph, index))


def _node(node: Any, names: bool) -> tuple[str, bool]:
    """``(name, is_kernel)`` of one node: the kernel's demangled name, else its type."""
    from cuda.bindings import driver as drv
    from cuda.bindings import runtime as rt

    (kind,) = _check(rt.cudaGraphNodeGetType(node))
    if kind != rt.cudaGraphNodeType.cudaGraphNodeTypeKernel:
        return str(getattr(kind, "name", kind)).removeprefix("cudaGraphNodeType").lower(), False
    if not names:
        return "", True
    (params,) = _check(drv.cuGraphKernelNodeGetParams(drv.CUgraphNode(init_value=int(node))))
    try:
        (name,) = _check(drv.cuFuncGetName(params.func))
    except RuntimeError:  # NOTE: a library kernel may be given as ``kern`` with no ``func``
        (name,) = _check(drv.cuKernelGetName(params.kern))
    return demangle(name.decode() if isinstance(name, bytes) else str(name)), True


def _edges(graph: Any, index: dict[int, int]) -> list[tuple[int, int, bool]]:
    """``(from, to, programmatic)`` node indices of every edge.

    NOTE: CUDA 12 bindings name the call with edge data ``cudaGraphGetEdges_v2``; CUDA 13 gives
    ``cudaGraphGetEdges`` the edge data. Without edge data a graph holding a programmatic edge
    refuses the query (``cudaErrorLossyQuery``), so a plain answer means none is programmatic.
    """
    from cuda.bindings import runtime as rt

    call = getattr(rt, "cudaGraphGetEdges_v2", None) or rt.cudaGraphGetEdges
    count = _check(call(graph, 0))[-1]
    found = _check(call(graph, count)) if count else ([], [], [], 0)
    frm, to = found[0], found[1]
    data = found[2] if len(found) == 4 else [None] * len(frm)
    programmatic = _value(getattr(rt.cudaGraphDependencyType, "cudaGraphDependencyTypeProgrammatic", 1))
    return [
        (index[int(a)], index[int(b)], d is not None and _value(d.type) == programmatic)
        for a, b, d in zip(frm, to, data, strict=True)
    ]
