"""Capture and recapture: the half of :class:`GraphRuntime` that makes and drops graphs.

A mixin, so ``GraphRuntime``'s public methods (``capture``, ``recapture``, ``suggest_buckets``,
``release``) stay where users call them while the step path (``runtime.py``) stays short. It
reads the runtime's state (declared below) and never runs a step itself.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from graphrt.capture import BucketPolicy, CaptureEngine, Dispatcher, EmulatedEngine, optimal_buckets
from graphrt.kv import PagedKVCache, ReqToToken
from graphrt.metadata.families import Dummies, Families
from graphrt.runtime.fastpath import Routes
from graphrt.runtime.programs import PROGRAMS, StepEnv
from graphrt.runtime.progress import capture_progress
from graphrt.runtime.report import CaptureReport
from graphrt.runtime.telemetry import Telemetry, step_weights
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


class Capturing:
    """Capture, recapture and release of a :class:`GraphRuntime`'s graphs (a mixin)."""

    # NOTE: set by GraphRuntime.__init__; declared here for readers and type checkers.
    config: RuntimeConfig
    device: torch.device
    kv: PagedKVCache
    req_to_token: ReqToToken
    _pads: dict[ForwardMode, dict[str, int]]
    engine: CaptureEngine
    dispatcher: Dispatcher
    families: Families
    env: StepEnv
    backend: Any
    routes: Routes
    telemetry: Telemetry
    _outputs: dict[tuple[ForwardMode, int], Any]
    _lock: threading.Lock

    @property
    def allocation(self) -> int:
        """Requests the static buffers hold: the largest bucket any ladder may have."""
        return self.families.step.dims.max_bs

    def rows_per_req(self, mode: ForwardMode) -> int:
        """Token rows per request in a graph of ``mode`` (the view's rows per request)."""
        return rows_per_req(mode, self.config.speculative)

    def pad_values(self, mode: ForwardMode) -> dict[str, int]:
        """Values padded rows of ``mode`` hold (DESIGN rule 3), by the names the pad rules use."""
        pads = self._pads.get(mode)
        if pads is None:
            dummies = Dummies(self.kv.dummy_slot, self.kv.dummy_page, self.req_to_token.dummy_req)
            pads = self._pads[mode] = self.families.pad_values(mode, dummies)
        return pads

    def _write(self, batch: Batch, bucket: int, tokens: int, pad: dict[str, int] | None = None) -> None:
        """Write ``batch`` into the families of its mode for ``bucket`` (the step path and the
        capture's all-padding batch alike); in debug mode the families are poisoned first."""
        if self.config.debug:
            for family in self.families.used_by(batch.mode):
                family.poison()
        self.families.write(batch, bucket, tokens, pad or self.pad_values(batch.mode))

    def capture(self, show_progress: bool = False) -> CaptureReport:
        """Capture every (mode, bucket) in ``config``, largest bucket first, gc frozen."""
        with self._lock:
            return self._capture_all(show_progress)

    def suggest_buckets(self, max_graphs: int, *, largest: int | None = None) -> tuple[int, ...]:
        """The ladder of at most ``max_graphs`` buckets that pads the observed steps least.

        Minimises the padded token rows of every graphed step recorded so far (telemetry's
        histogram: each step weighs its mode's rows per request) with an exact dynamic
        program (:func:`graphrt.capture.optimal_buckets`). ``largest`` (default: the
        allocation's ``max_batch_size``, so no batch the buffers hold runs eagerly) is always
        in; steps larger than it are left out (no ladder could serve them).
        """
        if max_graphs < 1:
            raise ValueError(f"max_graphs must be >= 1, got {max_graphs}")
        top = self.allocation if largest is None else largest
        if not 1 <= top <= self.allocation:
            raise ValueError(f"largest bucket {top} is outside 1..{self.allocation} (max_batch_size)")
        with self._lock:  # NOTE: run() adds to the histogram; copy it whole
            counts = dict(self.telemetry.batch_sizes)
        weights = step_weights(counts, self.config.capture_modes, self.rows_per_req, top)
        if not weights:
            raise ValueError(
                f"no graphed steps of at most {top} requests observed yet: run() some batches first"
            )
        return optimal_buckets(weights, max_graphs, top)

    def recapture(self, buckets: Sequence[int], show_progress: bool = False) -> CaptureReport:
        """Swap in a new ladder: drop every graph and capture ``buckets`` for every mode.

        ``buckets`` must be sorted unique ints in 1..``max_batch_size`` (checked before
        anything is dropped); the static buffers are reused. Holds the lock ``run()`` takes,
        so a concurrent step waits and then sees the new ladder whole. If a capture fails,
        every graph is dropped (steps run eagerly, counted) and the error propagates.
        """
        policy = BucketPolicy.exact(buckets, self.allocation)
        with self._lock:
            if self.device.type == "cuda":  # NOTE: no replay may still run in the pool we free
                torch.cuda.synchronize(self.device)
            self._drop_graphs()
            self.dispatcher.replace(policy)
            try:
                return self._capture_all(show_progress)
            except BaseException:
                self._drop_graphs()
                raise

    def release(self) -> None:
        """Drop every captured graph and its outputs (before tearing down a process group)."""
        with self._lock:
            self._drop_graphs()

    def _capture_all(self, show_progress: bool) -> CaptureReport:
        self.routes.clear()  # NOTE: routes name graphs; capture replaces them
        keys = [(m, b) for m in self.config.capture_modes for b in reversed(self.dispatcher.policy.buckets)]
        start = time.perf_counter()
        with self.engine.frozen_gc(), capture_progress(len(keys), show_progress) as advance:
            for mode, bucket in keys:
                self._capture_one(mode, bucket)
                advance(f"{mode.name} bs={bucket}")
        # NOTE: capture recorded updates it never ran; the next replay rewrites every column.
        self.families.forget_pages()
        graphs = tuple(g.info for g in self.dispatcher.graphs.values())
        report = CaptureReport(
            self.engine.name,
            self.backend.name,
            graphs,
            time.perf_counter() - start,
            self.families.step.memory_report(),
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
        self._write(empty_batch(mode), bucket, bucket * rows_per_req)
        program = PROGRAMS[mode]

        def step() -> torch.Tensor:
            with torch.no_grad():  # NOTE: no autograd state may be recorded into the graph
                return program(self.env, mode, inputs, rows_per_req)

        graph, out = self.engine.capture((mode, bucket), step, self.config.warmup)
        graph.info.host_scalars = self._host_scalars(mode, rows_per_req, inputs.cascade is not None)
        log.debug("captured %s bs=%d in %.1f ms", mode.name, bucket, graph.info.capture_seconds * 1e3)
        self.dispatcher.add(mode, bucket, graph)
        self._outputs[(mode, bucket)] = out

    def _host_scalars(self, mode: ForwardMode, max_q: int, cascade: bool) -> dict[str, Any]:
        """Every Python value the step's kernels receive, all functions of the graph key."""
        found: dict[str, Any] = {
            "max_seqlen_q": max_q,
            "page_size": self.config.page_size,
            "cascade": cascade,
        }
        if MODES[mode].draft_steps and self.config.speculative:
            found["draft_steps"] = self.config.speculative.draft_forwards
        return found | self.backend.host_scalars() | self.env.scalars.as_dict()

    def _drop_graphs(self) -> None:
        if self.device.type == "cuda":
            # NOTE: a replay still running must not find its graph and pool gone.
            torch.cuda.synchronize(self.device)
        for graph in self.dispatcher.graphs.values():
            reset = getattr(getattr(graph, "graph", None), "reset", None)
            if reset is not None:
                reset()
        self.dispatcher.graphs.clear()
        self._outputs.clear()
        self.routes.clear()
