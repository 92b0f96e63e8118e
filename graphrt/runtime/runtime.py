"""GraphRuntime: capture one graph per (mode, bucket); each step is an update plus a replay.

This module holds the step path (``run()``: checks, write, replay or eager, commit); capture
and recapture live in :mod:`graphrt.runtime.capturing`, the eager path in
:mod:`graphrt.runtime.eager`.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from typing import Any

import torch

from graphrt.attention import attention_kind
from graphrt.buffers import Dims
from graphrt.capture import BucketPolicy, Dispatcher
from graphrt.kv import PagedKVCache, ReqToToken
from graphrt.kv.ledger import KVWrites
from graphrt.metadata.families import Families
from graphrt.metadata.local import local_geometry
from graphrt.runtime.capturing import Capturing, make_engine
from graphrt.runtime.eager import run_eager
from graphrt.runtime.errors import PoisonLeft
from graphrt.runtime.fastpath import ModePlan, Route, Routes
from graphrt.runtime.feed import StepFeed
from graphrt.runtime.programs import ForwardFn, StepEnv
from graphrt.runtime.report import RuntimeStats
from graphrt.runtime.telemetry import Telemetry
from graphrt.step.batch import Batch
from graphrt.step.config import RuntimeConfig
from graphrt.step.limits import Limits, model_vocab_size
from graphrt.step.modes import MODES, ForwardMode


class GraphRuntime(Capturing):
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

    # ---- steps ---------------------------------------------------------------------------
    def run(self, batch: Batch, *, eager: bool = False, feed: StepFeed | None = None) -> torch.Tensor:
        """Run one step; returns the forward's output for the real tokens (a fresh tensor).

        A batch with ``Batch.sampling`` (runtime built with ``sample=True``) returns instead the
        token sampled inside the program for each request: ``[bs]`` int64.

        Replays the graph of the smallest captured bucket >= bs; falls back to eager (counted,
        with its reason) when none fits. Every check runs before anything is written: the
        batch's limits and geometry, KV isolation (the step reads only positions its rows
        have written, and writes each logical page of a row into the one page the row's page
        table names for it, a page no other row holds; ``KVIsolationError``) and the
        graph's host scalars. The step's KV state is committed to ``req_to_token.ledger``
        once it has run.

        One step at a time: a lock serialises callers from several threads (each waits for
        the step in flight), since every step shares the static buffers and the KV cache.

        ``feed`` (:mod:`graphrt.runtime.feed`; needs ``Batch.sampling``): the step's input ids
        are gathered on the device from each request row's last sampled token, and its sampled
        tokens recorded there, so the host need not read them before the next step. A graphed
        step then returns a view of the graph's output (no copy), valid until the next step:
        read it with a stream-ordered copy, as the overlapped engine does.
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
        out = route.result(batch.sampling is not None, batch.input_ids.size)
        if feed is None:
            return out.clone()
        feed.after(step, batch.bs, out)
        return out

    def _eager(self, batch: Batch, plan: ModePlan, feed: StepFeed | None = None) -> torch.Tensor:
        self._eager_steps[batch.mode] += 1
        return run_eager(batch, plan, self.families, self.env, self.config, self.kind, feed)

    def _check_poison(self, mode: ForwardMode, bucket: int, rows_per_req: int) -> None:
        left = [name for f in self.families.used_by(mode) for name in f.poisoned(bucket, rows_per_req)]
        if left:
            raise PoisonLeft(f"buffers not written by the update for bucket {bucket}: {left}")

    def stats(self) -> RuntimeStats:
        """Replays and eager steps per mode, and eager fallbacks per mode and reason."""
        fallbacks: dict[str, dict[str, int]] = {}
        for fb, n in self.dispatcher.fallbacks.items():
            fallbacks.setdefault(fb.mode.name, {})[fb.reason] = n
        replays = {m.name: n for m, n in self.dispatcher.replays.items()}
        eager = {m.name: n for m, n in self._eager_steps.items()}
        return RuntimeStats(replays, eager, fallbacks)
