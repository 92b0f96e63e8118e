"""What ``GraphRuntime.run()`` precomputes so a graphed step does little more than its checks.

Profiled on the CPU (``graphrt bench host --profile``), the host time of a step that was not
a check, the write or the launch went to lookups that give the same answer every step: the
mode table (an enum hash is a Python-level call, and a step made ~17), the
dispatcher, the graph's host scalars and the slice of the static output (a
``torch.Tensor.__getitem__`` is costly; docs/performance.md has the figures). They are functions of the mode, or of
``(mode, bs)``, and are worked out once here:

- :class:`ModePlan` per mode: the mode-table facts ``run()`` reads and the pad values.
- :class:`Route` per ``(mode, bs)`` on the graph path: the bucket, the graph, the host scalar
  it baked in and the views of its static output that a batch of ``bs`` requests returns.

Routes name captured graphs, so they go stale when the graphs change: the runtime drops
every route whenever it drops or captures graphs (``capture``, ``recapture``, ``release``). A
graph captured lazily, on a step's first use of its key, only adds the route that step needed.
Plans depend only on the runtime's config and never go stale.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from graphrt.capture import Dispatcher, Fallback, Graph, Pending, SplitGraph
from graphrt.runtime.errors import GraphFallbackError, HostScalarMismatch
from graphrt.runtime.programs import Sampled
from graphrt.runtime.telemetry import Telemetry
from graphrt.step.batch import Batch
from graphrt.step.modes import MODES, ForwardMode

log = logging.getLogger("graphrt.runtime.runtime")


@dataclass(frozen=True, slots=True)
class ModePlan:
    """The facts of one mode that ``run()`` needs every step (configuration, never data)."""

    mode: ForwardMode
    name: str
    graphed: bool
    ragged: bool
    #: Tree drafts write their steps to scratch slots that enter no request row.
    scratch: bool
    rows_per_req: int
    #: Values padded rows hold (rule 3 of docs/architecture.md), by the names the pad rules use.
    pad: dict[str, int]
    #: Buckets count query tokens (MIXED): a step's route is picked by its token count.
    token_bucket: bool = False
    #: A sampling program's logits hold each request's last row only (``ModeSpec.last_rows_only``).
    last_rows: bool = False
    #: The runtime captures the mode's lean graphs (:mod:`graphrt.runtime.lean`).
    lean: bool = False

    @classmethod
    def of(
        cls, mode: ForwardMode, scratch: bool, rows_per_req: int, pad: dict[str, int], lean: bool = False
    ) -> ModePlan:
        spec = MODES[mode]
        graphed, ragged = bool(spec.graphed), bool(spec.ragged)
        token_bucket, last_rows = bool(spec.token_bucket), bool(spec.last_rows_only)
        return cls(
            mode, mode.name, graphed, ragged, scratch, rows_per_req, pad, token_bucket, last_rows, lean
        )


@dataclass(slots=True)
class Route:
    """The graph a batch of ``bs`` requests of one mode replays, and what it returns.

    ``tokens``: the graph's token rows (``bucket * rows_per_req``); ``max_q``: the
    ``max_seqlen_q`` it was captured with; ``num_tokens``: the query tokens of a uniform
    batch of ``bs`` requests (-1 for ragged modes, whose count varies per step).
    """

    bucket: int
    graph: Graph | SplitGraph
    tokens: int
    max_q: int
    output: Any
    bs: int
    num_tokens: int
    #: Request rows the graph holds (the bucket; MIXED: ``min(bucket, max_batch_size)``).
    rows: int = 0
    #: The mode's :attr:`ModePlan.last_rows` (how :func:`select` slices a sampling output).
    last_rows: bool = False
    #: The variants' routes beside this one by kind, once a step asked (:meth:`Routes.variant`;
    #: None: the key has none of that kind).
    variants: dict[str, Route | None] = field(default_factory=dict)
    #: The kind of variant this route replays (:mod:`graphrt.runtime.variants`), or None.
    kind: str | None = None
    #: The static output's real rows, sliced once: logits / forward output, sampled tokens.
    _views: dict[bool, torch.Tensor] = field(default_factory=dict)

    def launch(self, ready: Callable[[], None] | None) -> None:
        """Replay the graph: a split pair (:class:`~graphrt.capture.SplitGraph`, ``output`` the
        sampler's) calls ``ready`` between its parts, while the forward runs on the device; a
        single graph runs after ``ready`` (if any)."""
        if isinstance(self.graph, SplitGraph):
            self.graph.replay(ready)
            return
        if ready is not None:
            ready()
        self.graph.replay()

    def result(self, sampled: bool, num_tokens: int) -> torch.Tensor:
        """The real rows of the static output (a view; the caller clones it).

        ``sampled``: the batch asked for tokens (``Batch.sampling``). A batch whose token count
        differs from the uniform one (ragged modes) is sliced on the spot.
        """
        if num_tokens != self.num_tokens:
            return select(self.output, sampled, self.bs, num_tokens, self.last_rows)
        view = self._views.get(sampled)
        if view is None:
            view = self._views[sampled] = select(self.output, sampled, self.bs, num_tokens, self.last_rows)
        return view


def select(out: Any, sampled: bool, bs: int, num_tokens: int, last_rows: bool) -> torch.Tensor:
    """The real rows of a program's output: sampled tokens ``[bs]`` when the batch asked for
    them, else the forward's output ``[num_tokens, ...]`` (``last_rows``, the mode's
    :attr:`ModePlan.last_rows`: a sampling program's logits are each request's last row's
    ``[bs, V]``, the only rows its head computed)."""
    if isinstance(out, Sampled):
        if sampled:
            return out.tokens[:bs]
        return out.logits[: bs if last_rows else num_tokens]
    return out[:num_tokens]


def step_logprobs_of(out: Any, batch: Batch) -> torch.Tensor | None:
    """The real rows of a sampling step's packed log-probabilities, or None."""
    if batch.sampling is None or not isinstance(out, Sampled) or out.logprobs is None:
        return None
    return out.logprobs[: batch.bs]


class Routes:
    """Routes per mode and ``bs``, made on a step's first visit; :meth:`clear` drops them all.

    ``outputs`` is the runtime's ``(mode, bucket) -> static output`` (shared, not copied);
    ``shape(mode, bucket)`` a graph's rows, tokens and ``max_seqlen_q`` (the capturer's);
    ``capture(mode, bucket)`` makes a pending graph (lazy capture) before its first route;
    ``variant_of(kind, mode, bucket)`` gives (making it if missing) the key's variant of that
    kind and its output (:mod:`graphrt.runtime.variants`).
    A token-bucketed mode (MIXED) keeps its routes by token count, not ``bs``. A step that asks
    for a variant of a key still pending (lazy capture) captures that variant only: its route
    (:meth:`alone`) stands without the key's graph, which the first step that needs it captures.
    """

    def __init__(
        self,
        dispatcher: Dispatcher,
        outputs: dict[tuple[ForwardMode, int], Any],
        shape: Callable[..., Any],
        capture: Callable[[ForwardMode, int], None],
        variant_of: Callable[[str, ForwardMode, int], tuple[Any, Any] | None],
    ) -> None:
        self.dispatcher, self.outputs, self.shape, self.capture = dispatcher, outputs, shape, capture
        self.variant_of = variant_of
        self.by_mode: dict[ForwardMode, dict[int, Route]] = {}
        #: Routes of variants captured without their key's graph, by (mode, kind) and size.
        self.alone_routes: dict[tuple[ForwardMode, str], dict[int, Route]] = {}

    def clear(self) -> None:
        """Forget every route (the graphs they name were dropped or replaced)."""
        self.by_mode.clear()
        self.alone_routes.clear()

    def get(
        self, batch: Batch, plan: ModePlan, strict: bool, telemetry: Telemetry, kind: str | None = None
    ) -> Route | None:
        """The route of ``batch`` (its host scalars checked), or None: run it eagerly. ``kind``
        (:data:`~graphrt.runtime.variants.SPLIT`: a step with ``ready``; ``LEAN``): that
        variant's route where the key has one (:meth:`variant`, :meth:`alone`).

        A fallback is never cached: each one is counted (``strict``: raised instead).
        """
        bs = batch.seq_lens.size
        size = batch.input_ids.size if plan.token_bucket else bs
        routes = self.by_mode.setdefault(plan.mode, {})
        route = routes.get(size)
        if route is None and kind is not None:
            alone = self.alone(batch, plan, kind, size)
            if alone is not None:
                return alone
        if route is None or route.bs != bs:
            chosen = self.dispatcher.select(plan.mode, size)
            if not isinstance(chosen, Fallback):
                rows = self.shape(plan.mode, chosen.bucket if isinstance(chosen, Pending) else chosen[0]).rows
                if rows < bs:
                    chosen = Fallback(plan.mode, f"bs {bs} > the {rows} requests a {size}-token graph holds")
            if isinstance(chosen, Pending):  # NOTE: lazy capture: this step is its first use
                # NOTE: refused before anything is captured; a graph bakes in its max_seqlen_q
                check_host_scalars(batch, plan.ragged, self.shape(plan.mode, chosen.bucket).max_q)
                self.capture(chosen.mode, chosen.bucket)
                chosen = self.dispatcher.select(plan.mode, size)
            if isinstance(chosen, Fallback):
                if strict:
                    raise GraphFallbackError(chosen.reason)
                self.dispatcher.count_fallback(chosen)
                log.debug("%s bs=%d runs eagerly: %s", plan.name, bs, chosen.reason)
                telemetry.fell_back(plan.name, bs, chosen.reason)
                return None
            bucket, graph = chosen
            max_q = graph.info.host_scalars["max_seqlen_q"]
            route = routes[size] = self._new(
                plan, bucket, graph, self.outputs[(plan.mode, bucket)], bs, max_q
            )
        check_host_scalars(batch, plan.ragged, route.max_q)
        if kind is not None:
            return self.variant(route, plan.mode, kind) or route
        return route

    def alone(self, batch: Batch, plan: ModePlan, kind: str, size: int) -> Route | None:
        """The route of the ``kind`` variant of ``batch``'s key while the key itself is pending
        (captured now if missing, its host scalars checked), or None: the key is captured (or
        falls back, or holds too few rows), or the variant has none or failed to capture."""
        bs, routes = batch.seq_lens.size, self.alone_routes.setdefault((plan.mode, kind), {})
        route = routes.get(size)
        if route is None or route.bs != bs:
            chosen = self.dispatcher.select(plan.mode, size)
            if not isinstance(chosen, Pending):
                return None
            shape = self.shape(plan.mode, chosen.bucket)
            if shape.rows < bs:
                return None
            check_host_scalars(batch, plan.ragged, shape.max_q)  # NOTE: refused before any capture
            made = self.variant_of(kind, plan.mode, chosen.bucket)
            if made is None:
                return None
            route = routes[size] = self._new(plan, chosen.bucket, *made, bs, shape.max_q, kind)
        check_host_scalars(batch, plan.ragged, route.max_q)
        return route

    def _new(
        self,
        plan: ModePlan,
        bucket: int,
        graph: Any,
        output: Any,
        bs: int,
        max_q: int,
        kind: str | None = None,
    ) -> Route:
        """The route of ``bs`` requests through ``graph`` (bucket ``bucket``, baked ``max_q``)."""
        shape, n = self.shape(plan.mode, bucket), -1 if plan.ragged else bs * plan.rows_per_req
        return Route(bucket, graph, shape.tokens, max_q, output, bs, n, shape.rows, plan.last_rows, kind=kind)

    def variant(self, route: Route, mode: ForwardMode, kind: str) -> Route | None:
        """The route of ``route``'s ``kind`` variant, or None: the mode has none, or its
        capture failed (the step replays ``route``'s own graph)."""
        if kind not in route.variants:
            made = self.variant_of(kind, mode, route.bucket)  # NOTE: None stays None (routes are
            # dropped whenever graphs are captured or dropped)
            route.variants[kind] = made and dataclasses.replace(
                route, graph=made[0], output=made[1], _views={}, variants={}, kind=kind
            )
        return route.variants[kind]


def check_host_scalars(batch: Batch, ragged: bool, max_seqlen_q: int) -> None:
    """The batch's ``max_seqlen_q`` must not exceed the one the graph baked in (rule 4)."""
    if not batch.seq_lens.size:
        needed = 0
    elif ragged:
        needed = int(batch.q_lens.max())
    else:  # NOTE: a checked uniform batch has one q_len for every request
        needed = int(batch.q_lens[0])
    if needed > max_seqlen_q:
        raise HostScalarMismatch(
            f"max_seqlen_q: batch needs {needed}, graph was captured with {max_seqlen_q}"
        )
