"""CUDA capture engine: ``torch.cuda.CUDAGraph`` in one shared pool, warm-up first, gc frozen."""

from __future__ import annotations

import logging
import os
import tempfile
import time
import warnings
from collections.abc import Callable, Hashable
from contextlib import AbstractContextManager
from typing import Any

import torch

from graphrt.capture.graph import GraphInfo, frozen_gc
from graphrt.capture.kernels import parse_dot, with_times
from graphrt.capture.topology import cuda_topology, with_pdl

log = logging.getLogger(__name__)


def pool_reserved(device: torch.device) -> int:
    """Bytes the caching allocator holds in segments (every pool, graph pools included)."""
    return int(torch.cuda.memory_stats(device).get("reserved_bytes.all.current", 0))


class CudaGraph:
    """A captured ``torch.cuda.CUDAGraph`` and the facts recorded about it."""

    def __init__(self, graph: torch.cuda.CUDAGraph, info: GraphInfo) -> None:
        self.graph, self.info = graph, info

    def replay(self) -> None:
        """Launch the graph on the current stream (asynchronous) and count the replay."""
        self.graph.replay()
        self.info.replays += 1


class CudaEngine:
    """Captures into one private memory pool shared by every graph of the runtime.

    Graphs sharing a pool must never run concurrently and must not read each other's
    intermediates; the runtime replays one graph at a time on one stream, which keeps both.
    Capture largest bucket first so smaller graphs reuse the pool's blocks.
    """

    name = "cuda"

    def __init__(self, device: torch.device, record_kernels: bool = False) -> None:
        self.device = device
        self.pool = torch.cuda.graph_pool_handle()
        self.stream = torch.cuda.Stream(device)
        self.record_kernels = record_kernels

    def frozen_gc(self) -> AbstractContextManager[None]:
        """Collect once, then keep the garbage collector off the heap while capturing."""
        return frozen_gc()

    def capture(self, key: Hashable, fn: Callable[[], Any], warmup: int) -> tuple[CudaGraph, Any]:
        """Run ``fn`` ``warmup`` times, then capture it; kernels, launch dims and (one profiled
        replay) kernel times are recorded when ``record_kernels``. The node count and the
        programmatic (PDL) edges are read always, where ``cuda.bindings`` is installed."""
        torch.cuda.synchronize(self.device)
        start = time.perf_counter()
        with torch.cuda.stream(self.stream):
            for _ in range(warmup):
                fn()
        torch.cuda.synchronize(self.device)
        warmed = time.perf_counter()
        # NOTE: torch.cuda.graph() empties the allocator's cache on entry, which made
        # "reserved after - reserved before" negative (-490 MiB for 36 graphs). Emptying it
        # here first leaves only the private pool's own segments to change during capture.
        torch.cuda.empty_cache()
        before = pool_reserved(self.device)
        # NOTE: keep_graph so that instantiation is a step of its own, timed apart.
        graph = torch.cuda.CUDAGraph(keep_graph=True)
        if self.record_kernels:
            graph.enable_debug_mode()
        recording = time.perf_counter()
        with torch.cuda.graph(graph, pool=self.pool, stream=self.stream):
            out = fn()
        recorded = time.perf_counter()
        graph.instantiate()
        done = time.perf_counter()
        pool_bytes = max(pool_reserved(self.device) - before, 0)
        # NOTE: node types and edges are a few driver calls; kernel names one more per kernel
        # node, so they are read only when the kernels are recorded anyway.
        topology = cuda_topology(graph, names=self.record_kernels)
        nodes, kernels = self._kernels(graph) if self.record_kernels else (0, ())
        if self.record_kernels and kernels:
            kernels = with_pdl(with_times(kernels, self._kernel_times(graph)), topology)
        nodes = topology.num_nodes if topology is not None else nodes
        info = GraphInfo(key, done - recording, pool_bytes, nodes, kernels, topology=topology)
        info.warmup_seconds, info.instantiate_seconds = warmed - start, done - recorded
        return CudaGraph(graph, info), out

    def _kernel_times(self, graph: torch.cuda.CUDAGraph) -> dict[str, float]:
        """GPU µs per kernel name in one profiled replay; empty when the profiler sees none.

        NOTE: capture left the buffers holding an all-padding batch, so this replay writes only
        the dummy KV slot, like the warm-up did.
        """
        from torch.profiler import ProfilerActivity, profile

        times: dict[str, float] = {}
        try:
            torch.cuda.synchronize(self.device)
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                graph.replay()
                torch.cuda.synchronize(self.device)
            for event in prof.events():
                if str(getattr(event, "device_type", "")).endswith("CUDA"):
                    us = getattr(event, "device_time", None)
                    if us is None:
                        us = getattr(event, "cuda_time", 0.0)
                    times[event.name] = times.get(event.name, 0.0) + float(us)
        except Exception as err:  # NOTE: times are a debugging aid; capture must not fail on them
            log.warning("kernel times not recorded: %s", err)
        return times

    @staticmethod
    def _kernels(graph: torch.cuda.CUDAGraph) -> tuple[int, tuple]:
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "graph.dot")
            with warnings.catch_warnings():  # NOTE: torch warns on every debug_dump call
                warnings.filterwarnings("ignore", message="DEBUG: calling")
                graph.debug_dump(path)
            with open(path) as f:
                return parse_dot(f.read())
