"""Capture and recapture: the :class:`Capturer` a :class:`GraphRuntime` holds.

It owns the capture engine, the dispatcher (graphs by mode and bucket), each graph's output
and the host scalars each graph baked in; the runtime's public ``capture`` / ``recapture`` /
``release`` call it under the runtime's lock. It never runs a step itself.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import numpy as np
import torch

from graphrt.capture import BucketPolicy, CaptureEngine, Dispatcher, EmulatedEngine
from graphrt.kernels import tuning
from graphrt.kernels.switches import Switches
from graphrt.metadata.families import Families
from graphrt.runtime.fastpath import Routes
from graphrt.runtime.programs import PROGRAMS, StepEnv
from graphrt.runtime.progress import capture_progress
from graphrt.runtime.report import CaptureReport
from graphrt.step.batch import Batch
from graphrt.step.config import RuntimeConfig
from graphrt.step.modes import MODES, ForwardMode, rows_per_req

log = logging.getLogger("graphrt.runtime.runtime")


def make_engine(name: str | None, device: torch.device, record_kernels: bool) -> CaptureEngine:
    """The capture engine ``name`` (default: CUDA graphs on a CUDA device, else emulated)."""
    name = name or ("cuda" if device.type == "cuda" else "emulated")
    if name == "emulated":
        return EmulatedEngine()
    if name == "cuda" and device.type == "cuda":
        from graphrt.capture.cuda import CudaEngine

        return CudaEngine(device, record_kernels)
    raise ValueError(f"capture engine {name!r} is not usable on {device}; use 'cuda' or 'emulated'")


def empty_batch(mode: ForwardMode) -> Batch:
    """A batch of no requests: capture runs on all-padding rows."""
    empty = np.zeros(0, dtype=np.int64)
    return Batch(mode, empty, empty, empty, empty, empty)


class Capturer:
    """Makes and drops the graphs of one runtime (the caller holds the runtime's lock)."""

    def __init__(
        self,
        config: RuntimeConfig,
        device: torch.device,
        families: Families,
        env: StepEnv,
        backend: Any,
        switches: Switches,
    ) -> None:
        self.config, self.device, self.families, self.env, self.backend = (
            config,
            device,
            families,
            env,
            backend,
        )
        #: The switches the runtime was built with (the capture report carries them).
        self.switches = switches
        #: The kernels' tuning table: the one the runtime installed just before making this.
        self.tuning = tuning.active()
        self.engine = make_engine(config.engine, device, config.record_kernels)
        self.dispatcher = Dispatcher(BucketPolicy.create(config.max_batch_size, config.buckets))
        #: Each graph's output (static tensors in the graph's pool), by (mode, bucket).
        self.outputs: dict[tuple[ForwardMode, int], Any] = {}
        #: Per mode and bs: the graph path's route; dropped with the graphs (runtime/fastpath.py).
        self.routes = Routes(self.dispatcher, self.outputs)

    def rows_per_req(self, mode: ForwardMode) -> int:
        """Token rows per request in a graph of ``mode`` (the view's rows per request)."""
        return rows_per_req(mode, self.config.speculative)

    def capture_all(self, show_progress: bool) -> CaptureReport:
        """Capture every (mode, bucket) of the config, largest bucket first, gc frozen."""
        self.routes.clear()  # NOTE: routes name graphs; capture replaces them
        keys = [(m, b) for m in self.config.capture_modes for b in reversed(self.dispatcher.policy.buckets)]
        start = time.perf_counter()
        with self.engine.frozen_gc(), capture_progress(len(keys), show_progress) as advance:
            for mode, bucket in keys:
                self._capture_one(mode, bucket)
                advance(f"{mode.name} bs={bucket}")
        # NOTE: capture recorded updates it never ran; the next replay rewrites everything.
        self.families.forget()
        graphs = tuple(g.info for g in self.dispatcher.graphs.values())
        report = CaptureReport(
            self.engine.name,
            self.backend.name,
            graphs,
            time.perf_counter() - start,
            self.families.step.memory_report(),
            self.switches.as_dict(),
            self.tuning.brief(),
        )
        log.info(
            "captured %d graphs in %.2f s, pool %.1f MiB (%s engine, %s backend)",
            len(graphs),
            report.seconds,
            report.pool_bytes / 2**20,
            report.engine,
            report.backend,
        )
        return report

    def _capture_one(self, mode: ForwardMode, bucket: int) -> None:
        rows_per_req = self.rows_per_req(mode)
        inputs = self.families.view(mode, bucket, rows_per_req)
        # NOTE: capture runs on an all-padding batch: valid dummy values, writes only the
        # dummy slot, and no real request's KV is touched by warm-up or capture.
        self.families.write(empty_batch(mode), bucket, bucket * rows_per_req, poison=self.config.debug)
        program, env = PROGRAMS[mode], self.env

        def step() -> torch.Tensor:
            with torch.no_grad():  # NOTE: no autograd state may be recorded into the graph
                return program(env, mode, inputs, rows_per_req)

        graph, out = self.engine.capture((mode, bucket), step, self.config.warmup)
        graph.info.host_scalars = self.host_scalars(mode, rows_per_req, inputs.cascade is not None)
        log.debug("captured %s bs=%d in %.1f ms", mode.name, bucket, graph.info.capture_seconds * 1e3)
        self.dispatcher.add(mode, bucket, graph)
        self.outputs[(mode, bucket)] = out

    def host_scalars(self, mode: ForwardMode, max_q: int, cascade: bool) -> dict[str, Any]:
        """Every Python value the step's kernels receive, all functions of the graph key."""
        found: dict[str, Any] = {
            "max_seqlen_q": max_q,
            "page_size": self.config.page_size,
            "cascade": cascade,
        }
        if MODES[mode].draft_steps and self.config.speculative:
            found["draft_steps"] = self.config.speculative.draft_forwards
        return found | self.backend.host_scalars() | self.env.scalars.as_dict()

    def drop(self) -> None:
        """Drop every graph, its output and the routes naming them (syncs first on CUDA)."""
        if self.device.type == "cuda":
            # NOTE: a replay still running must not find its graph and pool gone.
            torch.cuda.synchronize(self.device)
        for graph in self.dispatcher.graphs.values():
            reset = getattr(getattr(graph, "graph", None), "reset", None)
            if reset is not None:
                reset()
        self.dispatcher.graphs.clear()
        self.outputs.clear()
        self.routes.clear()
