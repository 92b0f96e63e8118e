"""GraphRuntime: capture one graph per (mode, bucket); each step is an update plus a replay.

This module holds the step path (``run()``: checks, write, replay or eager, commit) and the
public capture calls; making and dropping graphs is the :class:`~graphrt.runtime.capturer.Capturer`'s
job, the eager path :mod:`graphrt.runtime.eager`'s.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Sequence

import torch

from graphrt.attention import attention_kind
from graphrt.attention.needs import runtime_needs
from graphrt.capture import BucketPolicy, CaptureEngine, Dispatcher
from graphrt.kernels import switches, tuning
from graphrt.kv import EncoderKV, PagedKVCache, ReqToToken
from graphrt.kv.ledger import KVWrites
from graphrt.runtime.capturer import Capturer
from graphrt.runtime.eager import Ready, run_eager
from graphrt.runtime.errors import PoisonLeft
from graphrt.runtime.fastpath import ModePlan, Route, step_logprobs_of
from graphrt.runtime.feed import StepFeed, TokenFeed
from graphrt.runtime.layout import build_layout, routing_shape
from graphrt.runtime.lean import VariantChoice
from graphrt.runtime.penalties import TokenCounts
from graphrt.runtime.programs import ForwardFn, StepEnv
from graphrt.runtime.report import CaptureReport, RuntimeStats
from graphrt.runtime.telemetry import Telemetry, ladder_top, suggest_ladder
from graphrt.runtime.token_mask import TokenMasks
from graphrt.step.batch import Batch
from graphrt.step.config import RuntimeConfig
from graphrt.step.limits import Limits, model_vocab_size
from graphrt.step.modes import MODES, ForwardMode


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
        refused, save a fed step's ``FED`` placeholders (``run(feed=...)``).
    encoder : EncoderKV, optional
        An encoder-decoder model's encoder cache: every step then derives each request's
        encoder page table and length (``ctx.cross_attention``), and refuses a request row
        that holds no encoder output. DECODE is the only mode graphed with it.
    """

    def __init__(
        self,
        forward: ForwardFn,
        kv: PagedKVCache,
        req_to_token: ReqToToken,
        config: RuntimeConfig,
        *,
        vocab_size: int | None = None,
        encoder: EncoderKV | None = None,
    ) -> None:
        if kv.page_size != config.page_size:
            raise ValueError(f"KV page_size {kv.page_size} != config page_size {config.page_size}")
        self.forward, self.kv, self.req_to_token, self.config = forward, kv, req_to_token, config
        self.device = kv.device
        #: The ``GRAPHRT_*`` switches (a bad one is refused) and this GPU's kernel tiles, read once here.
        self.switches, self.tuning = switches.refresh(), tuning.install_for(kv.device)
        self.kind = attention_kind(kv)
        max_bs = BucketPolicy.create(config.max_batch_size, config.buckets).largest
        needs = runtime_needs(self.kind.name, kv, config, max_bs, forward, encoder)
        self.backend = self.kind.select_backend(config.backend, self.device, needs)
        layout = build_layout(config, kv, req_to_token, self.backend, max_bs, encoder, routing_shape(forward))
        #: Each request row's last sampled token (:mod:`graphrt.runtime.feed`); with sampling.
        rows = req_to_token.max_reqs + 1
        self.tokens = TokenFeed(rows, req_to_token.dummy_req, self.device) if config.sample else None
        self.encoder, self.window, self.groups = encoder, layout.window, layout.groups
        self.buffers = self.groups.step
        vocab = vocab_size or model_vocab_size(forward)
        self.env = StepEnv(
            forward,
            kv,
            req_to_token,
            self.backend,
            config.page_size,
            self.kind.context,
            layout.local,
            layout.window,
            encoder=encoder,
            tokens=self.tokens,
            deterministic=config.deterministic,
            logprobs=config.logprobs,
            counts=TokenCounts.of(config.penalties, rows, vocab, self.device),
            masks=TokenMasks.of(config.token_masks, rows, vocab, self.device),
        )
        self.logprobs: torch.Tensor | None = None  # NOTE: the last step's [bs, 1 + 2K] (.logprobs)
        self.capturer = Capturer(config, self.device, self.groups, self.env, self.backend, self.switches)
        self._variant = VariantChoice(self.capturer.variants, self.env.masks)
        self.limits = Limits(
            req_to_token.max_reqs,
            config.max_context_len,
            config.page_size,
            kv.num_live_slots,
            vocab_size if vocab_size is not None else model_vocab_size(forward),
            config.speculative,
            tree=layout.geometry.tree,
            sample=config.sample,
        )
        self._plans: dict[ForwardMode, ModePlan] = {}
        self._eager_steps: Counter[ForwardMode] = Counter()
        self.telemetry = Telemetry()
        self._lock = threading.Lock()

    # ---- steps ---------------------------------------------------------------------------
    def run(
        self, batch: Batch, *, eager: bool = False, feed: StepFeed | None = None, ready: Ready | None = None
    ) -> torch.Tensor:
        """Run one step; returns the forward's output for the real tokens (a fresh tensor), or
        with ``Batch.sampling`` (``sample=True``) the token each request sampled in the program:
        ``[bs]`` int64. Such a runtime's EXTEND / MIXED head runs on each request's last token
        only: unsampled, they return ``[bs, V]``.

        Replays the graph of the smallest captured bucket >= bs; falls back to eager (counted,
        with its reason) when none fits. Every check runs before anything is written: the
        batch's limits and geometry, KV isolation (the step reads only positions its rows
        have written and writes no slot another live row holds; ``KVIsolationError``) and the
        graph's host scalars. The step's KV state is committed to ``req_to_token.ledger``
        once it has run. One step at a time: a lock serialises callers' steps.

        ``feed`` (:mod:`graphrt.runtime.feed`; ``self.tokens.decode`` or ``.prefill``; needs
        ``Batch.sampling``): the step records its sampled tokens in ``self.tokens``, by request
        row, so the host need not read them before the next step; a DECODE step with
        ``tokens.decode`` gives ``FED`` (-1) as every input id and gathers them there, inside
        its graph. A graphed step then returns a view of the graph's output (no copy), valid
        until the next step: read it with a stream-ordered copy, as the overlapped engine does.
        With a window pool (:mod:`graphrt.kv.window`) the step's window slots are assigned after
        the KV checks (refused, with nothing written, when the step would read released window
        pages or the pool has too few), and pages no later step reads are released after it.
        ``ready``: called once the step is checked and its metadata written, before its launch (a
        grammar's masks); with a split pair (:mod:`.split_pairs`), between its two graphs.
        """
        if feed is not None:
            feed.check(batch, self.tokens)
        with self._lock:
            batch.check(self.limits, fed=feed is not None and feed.gather)
            if self.encoder is not None:
                self.encoder.check_rows(batch.req_pool_indices)
            plan = self.plan(batch.mode)
            writes = KVWrites.of(batch, scratch=plan.scratch)
            ledger = self.req_to_token.ledger
            drop = ledger.check(writes)
            route = None if eager or not plan.graphed else self._route(batch, plan, ready)
            if self.window is not None:
                self.window.assign(batch, writes)
            try:
                out = (self._replay if route else self._eager)(batch, plan, route, feed, ready)
            except BaseException:
                # NOTE: the step may have written positions >= start: they hold nothing valid.
                ledger.truncate(writes.rows, writes.starts)
                raise
            ledger.commit(writes, drop)
            if self.window is not None:
                self.window.commit(writes)
            return out

    def plan(self, mode: ForwardMode) -> ModePlan:
        """The facts of ``mode`` that every step reads (made once per mode; see ``fastpath``)."""
        plan = self._plans.get(mode)
        if plan is None:
            scratch, lean = MODES[mode].draft_steps and self.groups.geometry.tree, mode in self._variant.modes
            plan = ModePlan.of(mode, bool(scratch), self.rows_per_req(mode), self.pad_values(mode), lean)
            self._plans[mode] = plan
        return plan

    def _route(self, batch: Batch, plan: ModePlan, ready: Ready | None = None) -> Route | None:
        """``batch``'s route (host scalars checked): its split pair's with ``ready``, its lean
        graph's when no row needs the sampler's extras (each where it has one)."""
        kind = self._variant(batch, plan, ready)
        return self.capturer.routes.get(batch, plan, self.config.strict, self.telemetry, kind)

    def _replay(
        self, batch: Batch, plan: ModePlan, route: Route, feed: StepFeed | None, ready: Ready | None
    ) -> torch.Tensor:
        start = time.perf_counter()
        self.groups.write(batch, route.rows, route.tokens, plan.pad, poison=self.config.debug)
        updated = time.perf_counter()
        # NOTE: no torch.no_grad() (costly per step): a CUDA graph replay records no autograd, and the
        # emulated engine's replay enters no_grad itself.
        route.launch(ready)  # NOTE: a split pair calls ready() while its forward runs
        if route.kind is not None:
            self.capturer.variants[route.kind].steps[plan.mode] += 1
        self.telemetry.replayed(plan.name, route.bs, route.bucket, start, updated, self.device)
        if self.config.debug:
            left = self.groups.poisoned(plan.mode, route.rows, plan.rows_per_req, route.tokens)
            if left:
                raise PoisonLeft(f"buffers not written by the update for {plan.name} {route.bucket}: {left}")
        self.dispatcher.count_replay(plan.mode)
        out = route.result(batch.sampling is not None, batch.input_ids.size)
        self.logprobs = step_logprobs_of(route.output, batch)
        if feed is None:
            return out.clone()
        if not feed.gather:  # NOTE: a gathering feed recorded inside the graph
            feed.after(self.buffers.view(route.rows, plan.rows_per_req, route.tokens), batch.bs, out)
        return out

    def _eager(
        self, batch: Batch, plan: ModePlan, route: Route | None, feed: StepFeed | None, ready: Ready | None
    ) -> torch.Tensor:
        """The eager step (``route``: unused, :meth:`_replay`'s argument)."""
        self._eager_steps[batch.mode] += 1
        out, raw = run_eager(batch, plan, self.groups, self.env, feed, ready)
        self.logprobs = step_logprobs_of(raw, batch)
        return out

    def stats(self) -> RuntimeStats:
        """Replays, eager and variant steps per mode, fallbacks per mode and reason, captures per key."""
        capturer = self.capturer
        return RuntimeStats.of(self.dispatcher, self._eager_steps, capturer.captures, capturer.variants)

    # ---- graphs ------------------------------------------------------------------------
    @property
    def dispatcher(self) -> Dispatcher:
        """The captured graphs by (mode, bucket), replay and fallback counts (the capturer's)."""
        return self.capturer.dispatcher

    @property
    def engine(self) -> CaptureEngine:
        """The capture engine: CUDA graphs or the emulated engine (the capturer's)."""
        return self.capturer.engine

    @property
    def allocation(self) -> int:
        """Requests the static buffers hold: the largest bucket any ladder may have."""
        return self.groups.step.dims.max_bs

    def rows_per_req(self, mode: ForwardMode) -> int:
        """Token rows per request in a graph of ``mode`` (the view's rows per request)."""
        return self.capturer.rows_per_req(mode)

    def pad_values(self, mode: ForwardMode) -> dict[str, int]:
        """Values padded rows of ``mode`` hold (rule 3 of docs/architecture.md)."""
        return self.groups.pad_values(mode)

    def capture(self, show_progress: bool = False) -> CaptureReport:
        """Capture every (mode, bucket) in ``config``, largest bucket first (lazy: mark them pending)."""
        with self._lock:
            return self.capturer.capture_all(show_progress)

    def capture_pending(self, show_progress: bool = False) -> CaptureReport:
        """Capture every key still pending now (lazy capture's rest; with TP on every rank)."""
        with self._lock:
            return self.capturer.capture_pending(show_progress)

    def report(self) -> CaptureReport:
        """The graphs captured so far, the keys pending and every capture's seconds."""
        with self._lock:
            return self.capturer.report()

    def suggest_buckets(self, max_graphs: int, *, largest: int | None = None) -> tuple[int, ...]:
        """The ladder of at most ``max_graphs`` buckets that pads the observed steps least: the
        padded token rows of every graphed step so far (telemetry's histogram, each step weighed
        by its mode's rows per request), minimised exactly (:func:`graphrt.capture.optimal_buckets`).
        ``largest`` (default: the allocation's ``max_batch_size``, so no batch the buffers hold
        runs eagerly) is always in; steps larger than it are left out (no ladder serves them)."""
        top = ladder_top(max_graphs, largest, self.allocation)
        with self._lock:  # NOTE: run() adds to the histogram; copy it whole
            counts = dict(self.telemetry.batch_sizes)
        modes = [m for m in self.config.capture_modes if not MODES[m].token_bucket]  # NOTE: MIXED: tokens
        return suggest_ladder(counts, modes, self.rows_per_req, max_graphs, top)

    def recapture(self, buckets: Sequence[int], show_progress: bool = False) -> CaptureReport:
        """Swap in a new ladder: drop every graph and capture ``buckets`` for every mode (lazy: pending).

        ``buckets``: sorted unique ints in 1..``max_batch_size``, checked before anything is
        dropped; the static buffers are reused. Holds ``run()``'s lock, so a concurrent step
        sees the new ladder whole. A failed capture drops every graph and propagates.
        """
        policy = BucketPolicy.exact(buckets, self.allocation)
        with self._lock:
            self.capturer.drop()
            self.dispatcher.replace(policy)
            try:
                return self.capturer.capture_all(show_progress)
            except BaseException:
                self.capturer.drop()
                raise

    def release(self) -> None:
        """Drop every captured graph and its outputs (before tearing down a process group)."""
        with self._lock:
            self.capturer.drop()
