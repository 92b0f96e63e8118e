"""Programmatic (PDL) edges of a captured graph: the emulated engine's recorded ops (CPU), and a
CUDA graph read through ``cuda.bindings`` (``-m gpu``: two skinny GEMMs with PDL on and off).

On the CPU without Triton no graphrt op launches with PDL (``ops.linear`` is ``F.linear``), so
the emulated tests record an op of this file's own with the same ``bool pdl`` schema argument
as ``graphrt::skinny_gemm``; the schema check itself runs on graphrt's real ops.
"""

from __future__ import annotations

import pytest
import torch

from graphrt.capture import EmulatedEngine, GraphTopology, KernelCount, TopologyNode
from graphrt.capture.topology import cuda_bindings_missing, cuda_topology, requests_pdl
from graphrt.kernels import prologue  # noqa: F401  (registers graphrt::prologue_*)
from graphrt.kernels import skinny as sk

_LIB = torch.library.Library("graphrt_topology_test", "DEF")
_LIB.define("scale(Tensor x, float s, bool pdl) -> Tensor")
_LIB.impl("scale", lambda x, s, pdl: x * s, "CompositeExplicitAutograd")
scale = torch.ops.graphrt_topology_test.scale


def _program(x: torch.Tensor) -> torch.Tensor:
    """Five ops: PDL first (no predecessor), PDL after PDL, torch, no PDL, PDL after that."""
    y = scale(x, 2.0, True)
    y = scale(y, 3.0, True)
    y = torch.tanh(y)
    y = scale(y, 0.5, False)
    return scale(y, 4.0, pdl=True)


def test_emulated_graph_marks_each_pdl_op_after_the_first(engine: EmulatedEngine) -> None:
    x = torch.tensor([0.1, -0.2, 0.3])
    graph, out = engine.capture("decode", lambda: _program(x), warmup=1)
    topo = graph.info.topology
    assert topo == GraphTopology(
        (
            TopologyNode("scale", True, False),
            TopologyNode("scale", True, True),
            TopologyNode("tanh", True, False),
            TopologyNode("scale", True, False),
            TopologyNode("scale", True, True),
        ),
        edges=4,
        programmatic_edges=2,
    )
    assert (topo.num_nodes, topo.kernel_nodes, graph.info.programmatic_edges) == (5, 5, 2)
    assert graph.info.kernels == (KernelCount("scale", 4, pdl=2), KernelCount("tanh", 1))
    x.copy_(torch.tensor([1.0, 2.0, -1.0]))
    graph.replay()
    torch.testing.assert_close(out, torch.tanh(x * 6) * 2, rtol=0, atol=0)


def test_emulated_graph_without_pdl_has_no_programmatic_edge(engine: EmulatedEngine) -> None:
    x = torch.ones(3)
    graph, _ = engine.capture("k", lambda: scale(scale(x, 2.0, False), 3.0, False).sum(), warmup=0)
    assert graph.info.programmatic_edges == 0 and graph.info.topology.edges == 2
    assert all(k.pdl == 0 for k in graph.info.kernels)


def test_graphrt_ops_ask_for_pdl_through_their_schema() -> None:
    tile = [4, 2048, 4, 1]
    ops = torch.ops.graphrt
    assert requests_pdl(ops.skinny_gemm.default, (None, None, None, tile, True), {})
    assert not requests_pdl(ops.skinny_gemm.default, (None, None, None, tile, False), {})
    assert requests_pdl(ops.prologue_silu_gemm.default, (None, None, None), {"tile": tile, "pdl": True})
    norm = ops.prologue_norm_gemm.default
    assert requests_pdl(norm, (*[None] * (len(norm._schema.arguments) - 1), True), {})
    assert not requests_pdl(torch.ops.aten.mm.default, (None, None), {})


def test_no_topology_without_a_cuda_graph_and_bindings() -> None:
    """Never an error: an object that is no CUDA graph (or no cuda.bindings) gives None."""
    assert cuda_topology(object()) is None
    if cuda_bindings_missing() is None:
        pytest.skip("cuda.bindings is installed here")
    assert "cuda.bindings" in cuda_bindings_missing()


# ---- CUDA ---------------------------------------------------------------------------------------
no_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA")
no_bindings = pytest.mark.skipif(cuda_bindings_missing() is not None, reason="no cuda.bindings")


def _two_gemms(pdl: bool | None) -> tuple[GraphTopology, tuple[KernelCount, ...]]:
    from graphrt.capture.cuda import CudaEngine

    device = torch.device("cuda")
    x = torch.randn(1, 2048, device=device, dtype=torch.bfloat16)
    w = torch.randn(2048, 2048, device=device, dtype=torch.bfloat16) * 0.02
    engine = CudaEngine(device, record_kernels=True)
    graph, _ = engine.capture("k", lambda: sk.skinny_linear(sk.skinny_linear(x, w, pdl=pdl), w, pdl=pdl), 1)
    assert graph.info.topology is not None
    # NOTE: the debug dump's nodes (grouped by name) and the bindings' nodes are the same graph
    assert sum(k.count for k in graph.info.kernels) == graph.info.topology.num_nodes == graph.info.num_nodes
    return graph.info.topology, graph.info.kernels


@pytest.mark.gpu
@no_cuda
@no_bindings
@pytest.mark.parametrize("pdl", [True, None])
def test_cuda_graph_programmatic_edge_into_the_second_gemm(pdl, monkeypatch) -> None:
    """``pdl=True``, or the default (PDL on SM90+): the second GEMM's node has the edge."""
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("PDL needs SM90+")
    monkeypatch.setenv(sk.PDL_ENV, "1")
    topo, kernels = _two_gemms(pdl)
    gemms = [n for n in topo.nodes if n.name == "_skinny"]
    assert [n.programmatic for n in gemms] == [False, True], topo.nodes
    assert topo.programmatic_edges >= 1
    assert next(k for k in kernels if k.name == "_skinny").pdl == 1


@pytest.mark.gpu
@no_cuda
@no_bindings
@pytest.mark.parametrize("off", ["arg", "env"])
def test_cuda_graph_without_pdl_has_no_programmatic_edge(off, monkeypatch) -> None:
    """``pdl=False``, or ``GRAPHRT_PDL=0``: the same two GEMMs, no programmatic edge."""
    monkeypatch.setenv(sk.PDL_ENV, "0" if off == "env" else "1")
    topo, kernels = _two_gemms(False if off == "arg" else None)
    assert [n.name for n in topo.nodes if n.kernel].count("_skinny") == 2
    assert topo.programmatic_edges == 0 and not any(n.programmatic for n in topo.nodes)
    assert all(k.pdl == 0 for k in kernels)
