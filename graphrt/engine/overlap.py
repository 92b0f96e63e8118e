"""The overlapped engine's device half: launch step N+1 before reading step N's tokens.

As in SGLang's overlap scheduler, the host prepares and launches the next step while the GPU
runs the current one, and learns a step's tokens one step late:

- the tokens a step samples stay on the device (:class:`graphrt.runtime.feed.TokenFeed`,
  indexed by request row) and the next DECODE step gathers its input ids from there inside
  its graph, so no step waits for the host to see the previous one's tokens and the device
  runs only the upload and the token copy between two replays;
- each step's tokens come back by one non-blocking copy into a pinned buffer (a ring of two:
  step N's is read while step N+1's is being filled) and an event; :meth:`Overlap.swap` hands
  back the step before the one just launched, read with :meth:`Launched.read`.

On the CPU the copy is synchronous and there are no events: the same code path, so CI runs it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from graphrt.buffers.stream import current_stream
from graphrt.engine.batches import DecodeRows
from graphrt.engine.request import Request
from graphrt.engine.spec_options import SpecOptions
from graphrt.runtime.eager import Ready
from graphrt.runtime.feed import TokenFeed
from graphrt.step.batch import Batch

#: Pinned buffers in the ring: the step being read and the step in flight.
DEPTH = 2


@dataclass(slots=True)
class Launched:
    """A launched step: its requests (in batch order) and where its tokens arrive."""

    reqs: list[Request]
    host: np.ndarray  # [bs] int64: a view of the ring's buffer (pinned on CUDA)
    copied: Any  # torch.cuda.Event recorded after the copy, or None (CPU: already there)
    #: A DECODE step: the rows it was built from (their stop tokens), and the mask of requests
    #: whose budget it used up. None: a prefill.
    rows: DecodeRows | None = None
    finishing: np.ndarray | None = None
    #: The step's packed log-probabilities ``[bs, 1 + 2K]`` float32 (a view of a pinned ring
    #: buffer on CUDA), arriving with the tokens; None when no request of the step asked.
    packed: np.ndarray | None = None
    #: Whether a request of the step follows a grammar (its state advances when read).
    constrained: bool = True
    #: Whether the step counts in its requests' ``Request.inflight`` (a prefill); a DECODE
    #: step of rows does not: the rows rebuilt while it is in flight count it (``pending``).
    counted: bool = True
    #: Ids (``id(request)``) of requests whose row is stale (an overlapped speculative round
    #: before it committed other than it assumed: :mod:`.spec_ahead`): dropped when read.
    stale: set[int] | None = None

    def read(self) -> np.ndarray:
        """The step's tokens ``[bs]`` int64: waits for its copy only (later steps keep running)."""
        if self.copied is not None:
            self.copied.synchronize()
        if self.counted:
            for r in self.reqs:
                r.inflight -= 1
        return self.host.copy()  # NOTE: a copy: the ring's buffer is filled again

    def kept(self, tokens: np.ndarray) -> list[tuple[Request, int]]:
        """``(request, token)`` of the step's requests whose ``tokens [bs]`` count: neither
        done (ended or aborted since the launch) nor stale."""
        drop = self.stale or ()
        pairs = zip(self.reqs, tokens.tolist(), strict=True)
        return [(r, t) for r, t in pairs if not (r.done or id(r) in drop)]


class HostRing:
    """:data:`DEPTH` pinned host buffers (``dtype``, ``size`` each) that launched steps copy their
    tokens into in turn, each with the CUDA event recorded after its copy (None on the CPU, or
    without ``events``: a ring whose copies another ring's event covers).

    A buffer is filled again :data:`DEPTH` launches later, after its step was read. Its views
    are made once per shape (a tensor slice and ``.numpy()`` cost microseconds a step).
    """

    def __init__(
        self, size: int, device: torch.device, dtype: torch.dtype = torch.int64, events: bool = True
    ) -> None:
        cuda = device.type == "cuda"
        self._host = [torch.empty(size, dtype=dtype, pin_memory=cuda) for _ in range(DEPTH)]
        self._events = [torch.cuda.Event() if cuda and events else None for _ in range(DEPTH)]
        self._slot = 0
        self._views: dict[tuple[int, tuple[int, ...]], tuple[torch.Tensor, np.ndarray]] = {}

    def take(self, shape: tuple[int, ...]) -> tuple[torch.Tensor, np.ndarray, Any]:
        """The next buffer's first entries as ``shape``: the tensor a step copies into, its
        numpy view (what the read returns) and the buffer's event."""
        slot, self._slot = self._slot, (self._slot + 1) % DEPTH
        view = self._views.get((slot, shape))
        if view is None:
            tensor = self._host[slot][: int(np.prod(shape))].view(shape)
            view = self._views[(slot, shape)] = (tensor, tensor.numpy())
        return (*view, self._events[slot])


class Overlap:
    """The token feed, the pinned ring and the step in flight of one engine.

    ``feed``: the runtime's (``GraphRuntime.tokens``: its DECODE graphs read it); ``max_bs``:
    the most requests one step holds.
    """

    def __init__(self, feed: TokenFeed, max_bs: int, device: torch.device) -> None:
        self.feed = feed
        self.ring = HostRing(max_bs, device)
        self.inflight: Launched | None = None
        self._max_bs, self._device = max_bs, device
        #: The log-probabilities' ring (float32 ``[bs, 1 + 2K]`` per step), made on first use.
        self._packed: HostRing | None = None

    def _copy_packed(self, src: torch.Tensor) -> np.ndarray:
        """Start the copy of a step's packed log-probabilities ``src [bs, 1 + 2K]`` into the
        next buffer of their ring; returns its host view (valid once the step's tokens are).

        NOTE: the log-probabilities ring turns only on the steps that ask, never faster than the
        tokens' ring: a buffer is refilled after its step was read, as a token buffer is. The
        tokens' event, recorded after this copy, covers it.
        """
        if self._packed is None:
            width = src.shape[1]
            self._packed = HostRing(self._max_bs * width, self._device, src.dtype, events=False)
        host, host_np, _ = self._packed.take(tuple(src.shape))
        host.copy_(src, non_blocking=True)
        return host_np

    def launch(
        self,
        runtime: Any,
        batch: Batch,
        reqs: list[Request],
        *,
        eager: bool,
        fed: bool,
        logprobs: bool = False,
        ready: Ready | None = None,
    ) -> Launched:
        """Run ``batch`` (sampled: ``Batch.sampling`` set) without reading its tokens.

        ``fed``: a DECODE batch whose input ids are gathered from the feed inside its graph
        (its host ``input_ids`` are ``FED``); else (a prefill) they are the prompts. Either
        records its tokens in the feed. A prefill counts in its requests' ``Request.inflight``
        until read; a fed step (:class:`DecodeRows`' batch) does not (a per-request loop
        less, twice a step): :meth:`pending` names its requests while it is in flight.
        ``ready``: what ``GraphRuntime.run`` calls after the step's metadata write (a
        constrained batch's read of the step in flight, and its masks): graphed, between the
        step's forward and sampler graphs (:mod:`graphrt.runtime.split_pairs`).
        """
        feed = self.feed.decode if fed else self.feed.prefill
        extra = {"ready": ready} if ready is not None else {}  # NOTE: a TP runtime takes none
        tokens = runtime.run(batch, eager=eager, feed=feed, **extra)
        host, host_np, event = self.ring.take((batch.bs,))
        host.copy_(tokens, non_blocking=True)
        # NOTE: the graph's rows are overwritten by the next step; steps without logprobs copy
        # nothing more
        packed = self._copy_packed(runtime.logprobs) if logprobs and runtime.logprobs is not None else None
        if event is not None:
            event.record(current_stream(tokens.device))
        if not fed:
            for r in reqs:
                r.inflight += 1
        return Launched(reqs, host_np, event, packed=packed, counted=not fed)

    def launch_rows(
        self,
        runtime: Any,
        rows: DecodeRows,
        *,
        eager: bool,
        logprobs: bool = False,
        constrained: bool = False,
        ready: Ready | None = None,
    ) -> Launched:
        """The fed DECODE of ``rows`` (:meth:`DecodeRows.batch`), launched (``ready``: as for
        :meth:`launch`), then ``rows`` advanced: the returned step's ``finishing`` holds the
        requests whose budget it uses up (the caller gives their rows back)."""
        batch = rows.batch(fed=True)
        launched = self.launch(
            runtime, batch, rows.reqs, eager=eager, fed=True, logprobs=logprobs, ready=ready
        )
        launched.rows, launched.finishing = rows, rows.advance()
        launched.constrained = constrained
        return launched

    def pending(self) -> set[int]:
        """Ids (``id(request)``) of the requests of the fed step in flight, whose token
        ``Request.inflight`` does not count; empty when none is in flight."""
        step = self.inflight
        return {id(r) for r in step.reqs} if step is not None and not step.counted else set()

    def swap(self, launched: Launched | None) -> Launched | None:
        """Make ``launched`` the step in flight; returns the one before it (to read now)."""
        previous, self.inflight = self.inflight, launched
        return previous


def unsupported(spec: SpecOptions | None, tp: int, record_logits: bool, chunked: bool = False) -> str | None:
    """Why an engine cannot overlap its steps, or None when it can.

    ``spec``: its speculation, if any: proposer chains overlap (:mod:`.spec_ahead`), draft
    models, trees and ``tp > 1`` do not (:func:`refusal`). ``record_logits`` reads every
    step's logits on the host. With
    tensor parallelism each step message names its feed, and every rank's runtime keeps its own
    (``GraphRuntime.tokens``, read by that rank's graphs).
    """
    speculative = refusal(spec, tp)
    if speculative:
        return speculative
    if record_logits:
        return "record_logits=True (logits are read on the host every step)"
    if chunked:
        # NOTE: a mixed step's decode rows take their input ids from the host (EXTEND)
        return "prefill_chunk (a mixed step's decode rows need the previous step's tokens on the host)"
    return None


def refusal(spec: SpecOptions | None, tp: int) -> str | None:
    """Why an engine speculating with ``spec`` cannot overlap its rounds; None when it can."""
    if spec is None:
        return None
    if spec.uses_draft_model:
        return (
            "speculative decoding with a draft model (its next drafts need its extend on the accepted tokens)"
        )
    if spec.geometry.topk > 1:
        return f"speculative decoding with tree drafts (topk {spec.geometry.topk}: the path's KV moves on the host)"
    if tp > 1:
        return f"speculative decoding with tp {tp} (each rank's feed would need the round's drafts)"
    return None
