"""Capture and recapture: the :class:`Capturer` a :class:`GraphRuntime` holds.

It owns the capture engine, the dispatcher (graphs by mode and bucket), each graph's output,
the host scalars each graph baked in and each key's variants (:mod:`.variants`): with token
masks its split pair (:mod:`.split_pairs`), with sampler extras its lean graph (:mod:`.lean`),
each captured with its key, or lazily on the first step that asks for it;
the runtime's public ``capture`` / ``recapture`` / ``release`` call it under the runtime's
lock. It never runs a step itself.

Lazy capture (``RuntimeConfig(capture="lazy")``): ``capture`` marks every key pending and the
step that first needs one captures it (:meth:`Capturer.on_first_use`, under the same lock,
after the step's checks and before its window slots, metadata or replay). That is safe for a
running batch because a capture runs on an all-padding batch: it writes the bucket's static
metadata (which every step rewrites whole, and which the writers are told to upload again), the
dummy KV slot and the dummy request row (token feed, token counts), never a live row's KV,
metadata or sampled token. Graphs share the engine's one memory pool whenever they are captured. With TP every rank runs the same
batch, so every rank captures the same key in the same step; whether all of them succeeded is
agreed on (``agree``, the group's ``all_true``) before any replays it, so a capture that fails
on one rank sends every rank down the same eager path, never into a collective the others skip.
A failure inside the warm-up or the recorded forward, where the ranks' collectives run, is a
collective failure like that of any step: the others raise ``CollectiveError`` after the group's
timeout.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import torch

from graphrt.capture import BucketPolicy, Dispatcher, SplitGraph
from graphrt.kernels import tuning
from graphrt.kernels.switches import Switches
from graphrt.metadata.buffer_groups import BufferGroups
from graphrt.runtime.capture_setup import (
    GraphShape,
    alone,
    empty_batch,
    host_scalars,
    make_engine,
    reset_graph,
    token_ladders,
)
from graphrt.runtime.fastpath import Routes
from graphrt.runtime.lean import lean_env
from graphrt.runtime.programs import PROGRAMS, SPLITS, StepEnv
from graphrt.runtime.progress import capture_progress
from graphrt.runtime.report import CaptureReport
from graphrt.runtime.split_pairs import record_pair
from graphrt.runtime.variants import LEAN, SPLIT, Key, Made, variants_of
from graphrt.step.config import RuntimeConfig
from graphrt.step.modes import MODES, ForwardMode, rows_per_req

log = logging.getLogger("graphrt.runtime.runtime")


class Capturer:
    """Makes and drops the graphs of one runtime (the caller holds the runtime's lock)."""

    def __init__(
        self,
        config: RuntimeConfig,
        device: torch.device,
        groups: BufferGroups,
        env: StepEnv,
        backend: Any,
        switches: Switches,
    ) -> None:
        self.config, self.device, self.groups, self.env, self.backend = config, device, groups, env, backend
        #: The switches the runtime was built with (the capture report carries them).
        self.switches = switches
        #: The kernels' tuning table: the one the runtime installed just before making this.
        self.tuning = tuning.active()
        self.engine = make_engine(config.engine, device, config.record_kernels)
        self.dispatcher = Dispatcher(
            BucketPolicy.create(config.max_batch_size, config.buckets), token_ladders(config)
        )
        #: Each graph's output (static tensors in the graph's pool), by (mode, bucket).
        self.outputs: dict[tuple[ForwardMode, int], Any] = {}
        #: Per mode and bs: the graph path's route; dropped with the graphs (runtime/fastpath.py).
        self.routes = Routes(self.dispatcher, self.outputs, self.shape, self.on_first_use, self.variant_of)
        #: The environment of the lean graphs (:mod:`.lean`): None without sampler extras.
        self.lean_env = lean_env(env) if config.sample else None
        #: Variants by kind (:mod:`.variants`): split pairs and lean graphs.
        self.variants = variants_of(config, self.lean_env is not None)
        self._recorders = {SPLIT: self._record_split, LEAN: self._record_lean}
        #: Captures per (mode, bucket) over the runtime's life, and their seconds in all.
        self.captures: Counter[tuple[ForwardMode, int]] = Counter()
        self.seconds = 0.0
        #: ``agree(ok, what)``: whether every rank's capture succeeded (a TP group's
        #: ``all_true``, set by :class:`~graphrt.runtime.tp.TPRuntime`; alone: ``ok``).
        self.agree: Callable[[bool, str], bool] = alone

    def rows_per_req(self, mode: ForwardMode) -> int:
        """Token rows per request in a graph of ``mode`` (the view's rows per request)."""
        return rows_per_req(mode, self.config.speculative)

    def shape(self, mode: ForwardMode, bucket: int) -> GraphShape:
        """Request rows, token rows and ``max_seqlen_q`` of the graph ``(mode, bucket)``: a
        token-bucketed mode's bucket counts tokens, any request may hold all of them."""
        if MODES[mode].token_bucket:
            return GraphShape(self.config.mixed_rows(bucket), bucket, bucket)
        per = self.rows_per_req(mode)
        return GraphShape(bucket, bucket * per, per)

    def keys(self) -> list[tuple[ForwardMode, int]]:
        """Every (mode, bucket) of the config, largest bucket first (smaller graphs reuse the pool)."""
        policy = self.dispatcher.policy_for
        return [(m, b) for m in self.config.capture_modes for b in reversed(policy(m).buckets)]

    def capture_all(self, show_progress: bool) -> CaptureReport:
        """Capture every (mode, bucket) of the config (and its split pair), largest bucket first,
        gc frozen; with lazy capture only mark them pending (steps capture them as they need them)."""
        self.routes.clear()  # NOTE: routes name graphs; capture replaces them
        if self.config.capture == "lazy":
            for mode, bucket in self.keys():
                self.dispatcher.expect(mode, bucket)
            return self.report(0.0)
        start = time.perf_counter()
        self._capture_keys(self.keys(), self.variant_keys(), show_progress)
        report = self.report(time.perf_counter() - start)
        log.info(
            "captured %d graphs in %.2f s, pool %.1f MiB (%s engine, %s backend)",
            len(report.graphs),
            report.seconds,
            report.pool_bytes / 2**20,
            report.engine,
            report.backend,
        )
        return report

    def capture_pending(self, show_progress: bool) -> CaptureReport:
        """Capture every key still pending now, and every variant still missing, largest
        bucket first (lazy capture's "the rest")."""
        start = time.perf_counter()
        keys = [k for k in self.keys() if k in self.dispatcher.pending]
        self._capture_keys(keys, self.variant_keys(), show_progress)
        return self.report(time.perf_counter() - start)

    def variant_keys(self) -> dict[str, list[Key]]:
        """Per kind, the keys whose variant is not captured yet (nor failed, nor their graph)."""
        return {kind: v.missing(self.keys(), self.dispatcher.failed) for kind, v in self.variants.items()}

    def _capture_keys(self, keys: list[Key], variants: dict[str, list[Key]], show_progress: bool) -> None:
        start = time.perf_counter()
        # NOTE: each key's graph, then its variants, in keys() order (largest bucket first)
        chosen = {None: set(keys)} | {kind: set(found) for kind, found in variants.items()}
        jobs = [(k, kind) for k in self.keys() for kind in chosen if k in chosen[kind]]
        try:
            with self.engine.frozen_gc(), capture_progress(len(jobs), show_progress) as advance:
                for (mode, bucket), kind in jobs:
                    if kind is None:
                        self._register(mode, bucket, *self._record(mode, bucket))
                    else:
                        self.variants[kind].made[(mode, bucket)] = self._recorders[kind](mode, bucket)
                    advance(f"{mode.name} bs={bucket}" + (f" ({kind})" if kind else ""))
        finally:
            # NOTE: capture recorded updates it never ran; the next replay rewrites everything.
            self.groups.forget()
            self.seconds += time.perf_counter() - start

    def on_first_use(self, mode: ForwardMode, bucket: int) -> None:
        """Capture the pending ``(mode, bucket)`` a step is about to replay (lazy capture).

        Every rank's outcome is agreed on first (:attr:`agree`). On failure anywhere the key is
        marked failed on every rank: its steps run eagerly, counted under the failure (raised
        as ``GraphFallbackError`` with ``strict``), and the error is logged.
        """
        what = f"{mode.name} bs={bucket}"
        made, why = self._first_use(self._record, mode, bucket, what, "its steps run eagerly")
        if made is not None:
            self._register(mode, bucket, *made)
        else:
            self.dispatcher.fail(mode, bucket, why)

    def variant_of(self, kind: str, mode: ForwardMode, bucket: int) -> Made | None:
        """The ``kind`` variant of ``(mode, bucket)`` and its static output, captured now if
        missing (a step's first use; agreed on as :meth:`on_first_use` does); None when
        ``mode`` has none or its capture failed (the step replays the key's own graph)."""
        what, record, variants = (
            f"{mode.name} bs={bucket} ({kind})",
            self._recorders[kind],
            self.variants[kind],
        )
        return variants.get(
            (mode, bucket), lambda: self._first_use(record, mode, bucket, what, variants.instead)
        )

    def _first_use(
        self,
        record: Callable[[ForwardMode, int], tuple[Any, Any]],
        mode: ForwardMode,
        bucket: int,
        what: str,
        then: str,
    ) -> tuple[tuple[Any, Any] | None, str]:
        """``record(mode, bucket)`` during a step, every rank's outcome agreed on: what it made,
        or None and why it failed (logged with ``then``, what happens instead; whatever it made
        is freed)."""
        start = time.perf_counter()
        made, error = None, None
        try:
            with self.engine.frozen_gc():
                made = record(mode, bucket)
        except Exception as err:  # NOTE: agreed on below, so that every rank takes one path
            error = err
        finally:
            self.groups.forget()  # NOTE: the step's own write must upload every buffer again
        ok = self.agree(error is None, f"lazy capture of {what}")
        self.seconds += time.perf_counter() - start
        if ok and made is not None:
            log.info("captured %s on first use", what)
            return made, ""
        if made is not None:
            reset_graph(made[0])
        why = f"{type(error).__name__}: {error}" if error is not None else "another rank's capture failed"
        log.error("lazy capture of %s failed (%s); %s", what, why, then)
        return None, why

    def _prepare(self, mode: ForwardMode, bucket: int) -> tuple[Any, GraphShape]:
        """The bucket's views and shape, the buffers written with an all-padding batch."""
        shape = self.shape(mode, bucket)
        inputs = self.groups.view(mode, shape.rows, self.rows_per_req(mode), shape.tokens)
        # NOTE: capture runs on an all-padding batch: valid dummy values, writes only the
        # dummy slot, and no real request's KV is touched by warm-up or capture.
        self.groups.write(empty_batch(mode), shape.rows, shape.tokens, poison=self.config.debug)
        return inputs, shape

    def _record(self, mode: ForwardMode, bucket: int, env: StepEnv | None = None) -> tuple[Any, Any]:
        """Capture ``(mode, bucket)`` on an all-padding batch; the graph and its static output
        (``env``: another than the runtime's, keyed ``(mode, bucket, "lean")``: :meth:`_record_lean`)."""
        inputs, shape = self._prepare(mode, bucket)
        program, max_q, used = PROGRAMS[mode], shape.max_q, self.env if env is None else env
        key = (mode, bucket) if env is None else (mode, bucket, LEAN)

        def step() -> torch.Tensor:
            with torch.no_grad():  # NOTE: no autograd state may be recorded into the graph
                return program(used, mode, inputs, max_q)

        graph, out = self.engine.capture(key, step, self.config.warmup)
        graph.info.host_scalars = self._scalars(mode, max_q, inputs)
        log.debug("captured %s bs=%d in %.1f ms", mode.name, bucket, graph.info.capture_seconds * 1e3)
        return graph, out

    def _record_lean(self, mode: ForwardMode, bucket: int) -> tuple[Any, Any]:
        """Capture ``(mode, bucket)``'s lean graph (:mod:`.lean`), keyed ``(mode, bucket, "lean")``."""
        return self._record(mode, bucket, self.lean_env)

    def _record_split(self, mode: ForwardMode, bucket: int) -> tuple[SplitGraph, Any]:
        """Capture ``(mode, bucket)``'s split pair (:func:`.split_pairs.record_pair`)."""
        inputs, shape = self._prepare(mode, bucket)
        scalars = self._scalars(mode, shape.max_q, inputs)
        split, warmup = SPLITS[mode], self.config.warmup
        return record_pair(self.engine, split, self.env, (mode, bucket), inputs, shape.max_q, warmup, scalars)

    def _scalars(self, mode: ForwardMode, max_q: int, inputs: Any) -> dict[str, Any]:
        cascade = inputs.cascade is not None
        return host_scalars(self.config, self.backend, self.env, mode, max_q, cascade)

    def _register(self, mode: ForwardMode, bucket: int, graph: Any, out: Any) -> None:
        self.dispatcher.add(mode, bucket, graph)
        self.outputs[(mode, bucket)] = out
        self.captures[(mode, bucket)] += 1

    def report(self, seconds: float | None = None) -> CaptureReport:
        """The graphs captured so far and the keys pending; ``seconds``: default, every capture's."""
        pending = tuple(k for k in self.keys() if k in self.dispatcher.pending)
        return CaptureReport(
            self.engine.name,
            self.backend.name,
            tuple(g.info for g in self.dispatcher.graphs.values())
            + tuple(info for v in self.variants.values() for info in v.infos()),
            self.seconds if seconds is None else seconds,
            self.groups.step.memory_report(),
            self.switches.as_dict(),
            self.config.capture,
            pending,
            self.tuning.brief(),
        )

    def drop(self) -> None:
        """Drop every graph, its output, the routes naming them and the pending keys (syncs
        first on CUDA)."""
        if self.device.type == "cuda":
            # NOTE: a replay still running must not find its graph and pool gone.
            torch.cuda.synchronize(self.device)
        for graph in self.dispatcher.graphs.values():
            reset_graph(graph)
        for variants in self.variants.values():
            for graph in variants.clear():
                reset_graph(graph)
        # NOTE: pending keys go too: no step may capture after a release (a process group
        # may be gone); capture() marks them again.
        self.dispatcher.clear()
        self.outputs.clear()
        self.routes.clear()
