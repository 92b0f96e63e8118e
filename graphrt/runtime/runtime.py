"""GraphRuntime: capture one graph per (mode, bucket); each step is an update plus a replay."""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from graphrt.attention import attention_kind
from graphrt.buffers import Dims
from graphrt.capture import (
    BucketPolicy,
    CaptureEngine,
    Dispatcher,
    EmulatedEngine,
    optimal_buckets,
)
from graphrt.kv import PagedKVCache, ReqToToken
from graphrt.kv.ledger import KVWrites
from graphrt.metadata.families import Dummies, Families
from graphrt.metadata.local import local_geometry
from graphrt.runtime.errors import PoisonLeft
from graphrt.runtime.fastpath import ModePlan, Route, Routes, select
from graphrt.runtime.feed import StepFeed
from graphrt.runtime.programs import PROGRAMS, ForwardFn, StepEnv
from graphrt.runtime.progress import capture_progress
from graphrt.runtime.report import CaptureReport, RuntimeStats
from graphrt.runtime.telemetry import Telemetry, step_weights
from graphrt.step.batch import Batch, Limits, model_vocab_size
from graphrt.step.config import RuntimeConfig
from graphrt.step.modes import MODES, ForwardMode, rows_per_req

log = logging.getLogger(__name__)


def make_engine(name: str | None, device: torch.device, record_kernels: bool) -> CaptureEngine:
    name = name or ("cuda" if device.type == "cuda" else "emulated")
    if name == "emulated":
        return EmulatedEngine()
    if name == "cuda" and device.type == "cuda":
        from graphrt.capture.cuda import CudaEngine

        return CudaEngine(device, record_kernels)
    raise ValueError(f"capture engine {name!r} is not usable on {device}; use 'cuda' or 'emulated'")


class GraphRuntime:
    """Wraps ``forward(input_ids, positions, ctx)`` so decode steps replay captured graphs.

    Parameters
    ----------
    forward : callable
        The model's forward; it calls ``ctx.attention(layer_id, q, k, v)`` per layer and
        returns ``[num_tokens, ...]`` (e.g. logits).
    kv : PagedKVCache
    req_to_token : ReqToToken
    config : RuntimeConfig
    vocab_size : int, optional
        Token ids are checked against it; default: the model's ``vocab_size`` attribute or its
        first ``nn.Embedding`` (:func:`graphrt.batch.model_vocab_size`). Negative ids are
        always refused.
    """

    def __init__(
        self,
        forward: ForwardFn,
        kv: PagedKVCache,
        req_to_token: ReqToToken,
        config: RuntimeConfig,
        *,
        vocab_size: int | None = None,
    ) -> None:
        if kv.page_size != config.page_size:
            raise ValueError(f"KV page_size {kv.page_size} != config page_size {config.page_size}")
        self.forward, self.kv, self.req_to_token, self.config = forward, kv, req_to_token, config
        self.device = kv.device
        self.kind = attention_kind(kv)
        self.backend = self.kind.select_backend(config.backend, self.device)
        self.engine = make_engine(config.engine, self.device, config.record_kernels)
        self.dispatcher = Dispatcher(BucketPolicy.create(config.max_batch_size, config.buckets))
        max_bs = self.dispatcher.policy.largest
        dims = Dims(max_bs, max_bs * config.max_rows_per_req, config.max_pages, config.max_context_len)
        local = local_geometry(config)
        self.families = Families(
            dims, self.device, config.speculative, self.kind, local, config.sample, config.page_size
        )
        self.buffers = self.families.step
        self.extra = self.families.extra  # the attention kind's own family, if any
        self.env = StepEnv(
            forward, kv, req_to_token, self.backend, config.page_size, self.kind.context, local
        )
        self.limits = Limits(
            req_to_token.max_reqs,
            config.max_context_len,
            config.page_size,
            kv.num_live_slots,
            vocab_size if vocab_size is not None else model_vocab_size(forward),
            config.speculative,
            tree=self.families.cascade is not None,
            sample=config.sample,
        )
        self._pads: dict[ForwardMode, dict[str, int]] = {}
        self._plans: dict[ForwardMode, ModePlan] = {}
        self._outputs: dict[tuple[ForwardMode, int], Any] = {}
        #: Per mode and bs: the graph path's route; dropped with the graphs (runtime/fastpath.py).
        self.routes = Routes(self.dispatcher, self._outputs)
        self._eager_steps: Counter[ForwardMode] = Counter()
        self.telemetry = Telemetry()
        self._lock = threading.Lock()

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

    # ---- capture -------------------------------------------------------------------------
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
            self.buffers.memory_report(),
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
        self._write(_empty_batch(mode), bucket, bucket * rows_per_req)
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

    # ---- steps ---------------------------------------------------------------------------
    def run(self, batch: Batch, *, eager: bool = False, feed: StepFeed | None = None) -> torch.Tensor:
        """Run one step; returns the forward's output for the real tokens (a fresh tensor).

        A batch with ``Batch.sampling`` (runtime built with ``sample=True``) returns instead the
        token sampled inside the program for each request: ``[bs]`` int64.

        Replays the graph of the smallest captured bucket >= bs; falls back to eager (counted,
        with its reason) when none fits. Every check runs before anything is written: the
        batch's limits and geometry, KV isolation (the step reads only positions its rows
        have written and writes no slot another live row holds; ``KVIsolationError``) and the
        graph's host scalars. The step's KV state is committed to ``req_to_token.ledger``
        once it has run.

        One step at a time: a lock serialises callers from several threads (each waits for
        the step in flight), since every step shares the static buffers and the KV cache.

        ``feed`` (:mod:`graphrt.runtime.feed`; needs ``Batch.sampling``): the step's input ids
        are gathered on the device from each request row's last sampled token, and its sampled
        tokens recorded there, so the host need not read them before the next step.
        """
        if feed is not None and batch.sampling is None:
            raise ValueError("a token feed records sampled tokens: the batch needs Batch.sampling")
        with self._lock:
            batch.check(self.limits)
            plan = self.plan(batch.mode)
            writes = KVWrites.of(batch, scratch=plan.scratch)
            ledger = self.req_to_token.ledger
            ledger.check(writes)
            route = None if eager or not plan.graphed else self._route(batch, plan)
            try:
                out = (
                    self._eager(batch, plan, feed)
                    if route is None
                    else self._replay(batch, plan, route, feed)
                )
            except BaseException:
                # NOTE: the step may have written positions >= start: they hold nothing valid.
                ledger.truncate(writes.rows, writes.starts)
                raise
            ledger.commit(writes)
            return out

    def plan(self, mode: ForwardMode) -> ModePlan:
        """The facts of ``mode`` that every step reads (made once per mode; see ``fastpath``)."""
        plan = self._plans.get(mode)
        if plan is None:
            scratch = MODES[mode].draft_steps and self.families.cascade in self.families.used_by(mode)
            plan = ModePlan.of(mode, bool(scratch), self.rows_per_req(mode), self.pad_values(mode))
            self._plans[mode] = plan
        return plan

    def _route(self, batch: Batch, plan: ModePlan) -> Route | None:
        """The graph route for ``batch`` (host scalars checked), or None: fall back to eager."""
        return self.routes.get(batch, plan, self.config.strict, self.telemetry)

    def _replay(
        self, batch: Batch, plan: ModePlan, route: Route, feed: StepFeed | None = None
    ) -> torch.Tensor:
        start = time.perf_counter()
        self._write(batch, route.bucket, route.tokens, plan.pad)
        updated = time.perf_counter()
        if feed is not None:
            step = self.buffers.view(route.bucket, plan.rows_per_req)  # NOTE: cached views: free
            feed.before(step, batch.bs)
        # NOTE: no torch.no_grad() (~3 µs): a CUDA graph replay records no autograd, and the
        # emulated engine's replay enters no_grad itself.
        route.graph.replay()
        self.telemetry.replayed(plan.name, route.bs, route.bucket, start, updated, self.device)
        if self.config.debug:
            self._check_poison(plan.mode, route.bucket, plan.rows_per_req)
        self.dispatcher.count_replay(plan.mode)
        out = route.result(batch.sampling is not None, batch.input_ids.size).clone()
        if feed is not None:
            feed.after(step, batch.bs, out)
        return out

    def _write(self, batch: Batch, bucket: int, tokens: int, pad: dict[str, int] | None = None) -> None:
        if self.config.debug:
            for family in self.families.used_by(batch.mode):
                family.poison()
        self.families.write(batch, bucket, tokens, pad or self.pad_values(batch.mode))

    def _eager(self, batch: Batch, plan: ModePlan, feed: StepFeed | None = None) -> torch.Tensor:
        self._eager_steps[batch.mode] += 1
        pad = plan.pad
        # NOTE: an IDLE step still runs one all-padding row (as its graph does), so a model
        # with collectives or side effects sees the same call shape either way.
        inputs = Families.exact(
            batch,
            max(batch.bs, 1),
            pad,
            self.families.step.dims,
            self.device,
            spec=self.config.speculative,
            kind=self.kind,
            local=self.env.local,
            sample=self.config.sample,
            page_size=self.config.page_size,
        )
        max_q = int(batch.q_lens.max()) if batch.bs else pad["pad_q_len"]
        with torch.no_grad():
            if feed is not None:
                feed.before(inputs.step, batch.bs)
            raw = PROGRAMS[batch.mode](self.env, batch.mode, inputs, max_q)
            out = select(raw, batch.sampling is not None, batch.bs, batch.num_tokens)
            if feed is not None:
                feed.after(inputs.step, batch.bs, out)
        return out

    def _check_poison(self, mode: ForwardMode, bucket: int, rows_per_req: int) -> None:
        left = [name for f in self.families.used_by(mode) for name in f.poisoned(bucket, rows_per_req)]
        if left:
            raise PoisonLeft(f"buffers not written by the update for bucket {bucket}: {left}")

    def release(self) -> None:
        """Drop every captured graph and its outputs (before tearing down a process group)."""
        with self._lock:
            self._drop_graphs()

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

    def stats(self) -> RuntimeStats:
        """Replays and eager steps per mode, and eager fallbacks per mode and reason."""
        fallbacks: dict[str, dict[str, int]] = {}
        for fb, n in self.dispatcher.fallbacks.items():
            fallbacks.setdefault(fb.mode.name, {})[fb.reason] = n
        replays = {m.name: n for m, n in self.dispatcher.replays.items()}
        eager = {m.name: n for m, n in self._eager_steps.items()}
        return RuntimeStats(replays, eager, fallbacks)


def _empty_batch(mode: ForwardMode) -> Batch:
    empty = np.zeros(0, dtype=np.int64)
    return Batch(mode, empty, empty, empty, empty, empty)
