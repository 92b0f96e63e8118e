"""What runs inside one step's graph, per mode: one table, no if/elif over modes.

A program takes the step's inputs (bucket views on the graph path, exact-size buffers on
the eager path) and returns the step's output. Every program first runs the device half of
the update (slots into ``req_to_token``, page table, cascade prefix), then the model. With a
sampling group (``RuntimeConfig(sample=True)``, modes with ``MODES[mode].samples``) it then
samples one token per request (TARGET_VERIFY: one per verify node) inside the same graph and
returns :class:`Sampled`; DECODE's
program also runs the token feed (:func:`fed_forward`, :func:`fed_sample`) around all of that.

DECODE's program is a :class:`SplitProgram`: its forward (the feed's gather and the model, up to
the logits) and its sampler (masks, penalties, the draw, log-probabilities, the feed's record)
are two functions, run back to back as one program (one graph) or captured as two graphs
(:data:`SPLITS`) for a runtime with token masks, so that a constrained step's masks can be
written while its forward runs (``GraphRuntime.run(ready=...)``). Both ways run the same ops.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch

from graphrt.attention import ContextInputs, CrossStep, LocalStep, ScalarLog
from graphrt.attention.context import WindowStep
from graphrt.kernels.switches import batch_invariant
from graphrt.kv import EncoderKV, ReqToToken
from graphrt.kv.window import WindowPool
from graphrt.metadata.base import StepBuffers, StepMetadata
from graphrt.metadata.buffer_groups import StepInputs
from graphrt.metadata.cascade import derive_prefix
from graphrt.metadata.encoder import derive_encoder
from graphrt.metadata.local import LocalGeometry, derive_local
from graphrt.metadata.step import derive
from graphrt.metadata.window import derive_window
from graphrt.runtime.draft_chain import draft_loop
from graphrt.runtime.feed import TokenFeed
from graphrt.runtime.penalties import TokenCounts
from graphrt.runtime.sampler.extras import sample_with_extras
from graphrt.runtime.token_mask import TokenMasks
from graphrt.runtime.verify_sampler import sample_nodes
from graphrt.step.modes import MODES, ForwardMode

#: ``forward(input_ids [T] int64, positions [T] int64, ctx) -> [T, ...]``.
ForwardFn = Callable[[torch.Tensor, torch.Tensor, Any], torch.Tensor]


@dataclass(frozen=True, slots=True)
class StepEnv:
    """What a program needs besides its inputs."""

    forward: ForwardFn
    kv: Any  # the attention kind's cache (PagedKVCache or MLAKVCache)
    req_to_token: ReqToToken
    backend: Any  # the attention kind's backend
    page_size: int
    context: Callable[[ContextInputs], Any]  # the attention kind's ctx builder
    local: LocalGeometry | None = None
    #: The window-layer KV pool (its ``mapping`` is recorded inside the graph), if any.
    window: WindowPool | None = None
    #: Per-layer scalars (window, chunk) the model passed; model constants, kept per graph.
    scalars: ScalarLog = field(default_factory=ScalarLog)
    #: An encoder-decoder model's encoder cache (its cross layers' K/V per request row).
    encoder: EncoderKV | None = None
    #: Each request row's last sampled token (``RuntimeConfig(sample=True)``; see :func:`fed`).
    tokens: TokenFeed | None = None
    #: Batch-invariant kernels in every forward (``RuntimeConfig.deterministic``).
    deterministic: bool = False
    #: Top log-probabilities each sampling step computes (``RuntimeConfig.logprobs``; 0: none).
    logprobs: int = 0
    #: Each request row's token counts for the penalties (``RuntimeConfig.penalties``).
    counts: TokenCounts | None = None
    #: Each request row's allowed-token bitmask (``RuntimeConfig.token_masks``).
    masks: TokenMasks | None = None

    def call(
        self,
        buffers: StepBuffers,
        meta: StepMetadata,
        input_ids: torch.Tensor,
        inputs: StepInputs,
        draft_step: int = 0,
    ) -> torch.Tensor:
        """Run the model; with ``local`` buffers, first derive this step's virtual batch, with
        ``encoder`` buffers each request's encoder page table and length.
        ``draft_step``: which of a DRAFT_DECODE chain's steps (its column of window slots)."""
        bound: LocalStep | None = None
        window: WindowStep | None = None
        cross: CrossStep | None = None
        if inputs.local is not None:
            assert self.local is not None, "local buffers without a local geometry"
            derive_local(buffers, inputs.local, self.req_to_token, self.local, self.kv.dummy_page)
            bound = LocalStep.bind(meta, inputs.local, self.local.chunk_size)
        if inputs.encoder is not None:
            assert self.encoder is not None, "encoder buffers without an encoder cache"
            derive_encoder(buffers, inputs.encoder, self.encoder)
            cross = CrossStep(self.encoder, inputs.encoder)
        if inputs.window is not None:
            assert self.window is not None, "window buffers without a window pool"
            window = WindowStep.bind(meta, inputs.window, self.window.window, draft_step)
        routing = inputs.routing
        inp = ContextInputs(
            meta,
            self.kv,
            self.backend,
            self.req_to_token,
            self.scalars,
            inputs.attention,
            bound,
            cross,
            window,
            None if routing is None else routing.routing(input_ids.shape[0]),
            None if routing is None else routing.num_tokens,
            head_rows(meta.mode, inputs),
        )
        with batch_invariant(self.deterministic):
            return self.forward(input_ids, buffers.positions, self.context(inp))

    def derive_window(self, buffers: StepBuffers, full_loc: torch.Tensor, inputs: StepInputs) -> None:
        """Record the step's window slots and gather the window page table (with a window pool)."""
        if inputs.window is not None:
            assert self.window is not None, "window buffers without a window pool"
            derive_window(buffers, full_loc, inputs.window, self.window.mapping, self.window)


def forward_once(env: StepEnv, mode: ForwardMode, inputs: StepInputs, max_q: int) -> torch.Tensor:
    """DECODE, TARGET_VERIFY (chain or tree), DRAFT_EXTEND, IDLE: one model forward.

    Returns the forward's output for every token row (``[T, ...]``).
    """
    b = inputs.step
    derive(b, env.req_to_token, env.page_size)
    env.derive_window(b, b.out_cache_loc[:, None], inputs)
    if inputs.cascade is not None:
        # NOTE: a verify tree is the last max_q (= num_draft_tokens) positions of each request.
        derive_prefix(inputs.cascade, b.cache_seqlens, max_q)
    meta = StepMetadata(mode, b, max_q, env.page_size, inputs.cascade)
    return env.call(b, meta, b.input_ids, inputs)


def head_rows(mode: ForwardMode, inputs: StepInputs) -> torch.Tensor | None:
    """``[R]`` int64, each request's last token row, where a step's head computes only those (a
    sampling step of a ragged mode: :attr:`ModeSpec.last_rows_only`, the rows it samples from; a
    prompt's other rows need no logits); else None (every row)."""
    if inputs.sampling is None or not MODES[mode].last_rows_only:
        return None
    return inputs.step.cu_seqlens_q[1:].long() - 1


class Sampled(NamedTuple):
    """A sampling step's output: ``logits`` of every token row ``[T, V]``, or in a mode with
    :attr:`ModeSpec.last_rows_only` of each request's last ``[R, V]`` (:func:`head_rows`), and
    ``tokens [R]`` int64, one sampled token per request row (drawn from its last token's
    logits); ``logprobs`` ``[R, 1 + 2K]`` float32 with ``RuntimeConfig.logprobs = K``
    (:mod:`.logprobs`), else None."""

    logits: torch.Tensor
    tokens: torch.Tensor
    logprobs: torch.Tensor | None = None


Program = Callable[[StepEnv, ForwardMode, StepInputs, int], Any]
#: ``(env, mode, inputs, max_q, logits)``: what a sampling program does after its forward.
Tail = Callable[[StepEnv, ForwardMode, StepInputs, int, Any], Any]


def sample_logits(env: StepEnv, mode: ForwardMode, inputs: StepInputs, logits: torch.Tensor) -> Sampled:
    """One token per request from ``logits`` (the forward's, see :class:`Sampled`): each
    request's mask (``env.masks``) and penalties (``env.counts``) applied, then the draw."""
    step = inputs.step
    assert inputs.sampling is not None, "sampling without a sampling group"
    # NOTE: [R] each request row's last token (a ragged mode's head computed only those)
    rows = logits if MODES[mode].last_rows_only else logits[step.cu_seqlens_q[1:].long() - 1]
    tokens, lp = sample_with_extras(
        rows, step.req_pool_indices, inputs.sampling, env.masks, env.counts, env.logprobs
    )
    return Sampled(logits, tokens, lp)


def sampled(program: Program) -> Program:
    """``program``, then (when the step has a sampling group) the sampler, in the same graph."""

    def run(env: StepEnv, mode: ForwardMode, inputs: StepInputs, max_q: int) -> Any:
        logits = program(env, mode, inputs, max_q)
        return logits if inputs.sampling is None else sample_logits(env, mode, inputs, logits)

    return run


def sampled_nodes(program: Program) -> Program:
    """TARGET_VERIFY's ``program``, then (with a sampling group) the target's token after every
    node, ``[R, nodes]``, drawn in the same graph (:mod:`graphrt.runtime.verify_sampler`)."""

    def run(env: StepEnv, mode: ForwardMode, inputs: StepInputs, max_q: int) -> Any:
        logits = program(env, mode, inputs, max_q)
        if inputs.sampling is None:
            return logits
        return Sampled(logits, sample_nodes(logits, inputs.sampling, inputs.step.positions, max_q))

    return run


def _gathered(
    gather: Callable[[TokenFeed, torch.Tensor, torch.Tensor], torch.Tensor], env: StepEnv, inputs: StepInputs
) -> StepInputs:
    """``inputs`` with the ids ``gather(feed, input_ids, req_pool_indices)`` makes of the
    host-written ones (which keep the flags, for the record) when the runtime has a feed and the
    step a sampling group. The ops see the whole bucket: a bucket's graph serves fed and unfed
    steps alike (the ids are the flag)."""
    tokens, step = env.tokens, inputs.step
    if tokens is None or inputs.sampling is None:
        return inputs
    ids = gather(tokens, step.input_ids, step.req_pool_indices)
    return dataclasses.replace(inputs, step=dataclasses.replace(step, input_ids=ids))


def fed_forward(env: StepEnv, mode: ForwardMode, inputs: StepInputs, max_q: int) -> torch.Tensor:
    """DECODE's forward: rows whose input id is ``FED`` take their id from the token feed
    (:mod:`.feed`; every other row, given ids and pad rows, keeps its own), then the model;
    the logits ``[T, V]``."""
    return forward_once(env, mode, _gathered(TokenFeed.gather, env, inputs), max_q)


def fed_sample(env: StepEnv, mode: ForwardMode, inputs: StepInputs, max_q: int, logits: Any) -> Any:
    """DECODE's sampler on :func:`fed_forward`'s ``logits``: :func:`sample_logits`, then each
    ``FED`` row records the token it sampled in the feed (an unfed step runs as unfed); without
    a sampling group, ``logits`` as they are."""
    if inputs.sampling is None:
        return logits
    out = sample_logits(env, mode, inputs, logits)
    if env.tokens is not None:
        TokenFeed.record(env.tokens, inputs.step.input_ids, inputs.step.req_pool_indices, out.tokens)
    return out


@dataclass(frozen=True, slots=True)
class SplitProgram:
    """A sampling program cut after its forward: ``forward(env, mode, inputs, max_q)`` returns
    the logits, ``sample(env, mode, inputs, max_q, logits)`` the step's output. Called, it runs
    both (one graph); a runtime with token masks also captures each as a graph of its own."""

    forward: Program
    sample: Tail

    def __call__(self, env: StepEnv, mode: ForwardMode, inputs: StepInputs, max_q: int) -> Any:
        return self.sample(env, mode, inputs, max_q, self.forward(env, mode, inputs, max_q))


def fed_nodes(program: Program) -> Program:
    """TARGET_VERIFY's ``program`` inside the feed, an overlapped round's pending tokens: negative
    ids (``FED`` node 0, ``PAD_DRAFT`` drafts) take their row's last token from the feed; each row
    whose node 0 was ``FED`` records the token after its accepted chain there, the next round's
    pending token. A round the host built (no negative id) runs as ``program``."""

    def run(env: StepEnv, mode: ForwardMode, inputs: StepInputs, max_q: int) -> Any:
        out = program(env, mode, _gathered(TokenFeed.gather_nodes, env, inputs), max_q)
        if env.tokens is not None and inputs.sampling is not None:
            step = inputs.step
            TokenFeed.record_bonus(env.tokens, step.input_ids, step.req_pool_indices, out.tokens)
        return out

    return run


#: Programs a constrained step (one whose masks are written after its metadata) may run as two
#: graphs: the modes a grammar's ``ready`` comes with (an overlapped DECODE).
SPLITS: dict[ForwardMode, SplitProgram] = {
    ForwardMode.DECODE: SplitProgram(fed_forward, fed_sample),  # NOTE: feed.FED_MODES lists it
}

PROGRAMS: dict[ForwardMode, Program] = {
    ForwardMode.DECODE: SPLITS[ForwardMode.DECODE],
    ForwardMode.TARGET_VERIFY: fed_nodes(sampled_nodes(forward_once)),
    ForwardMode.DRAFT_DECODE: draft_loop,
    ForwardMode.DRAFT_EXTEND: forward_once,
    ForwardMode.IDLE: forward_once,
    ForwardMode.EXTEND: sampled(forward_once),
    ForwardMode.MIXED: sampled(forward_once),
}
