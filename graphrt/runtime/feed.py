"""Token ids that stay on the device: each request row's last sampled token feeds its next step.

An overlapped engine launches step N+1 before it has read step N's tokens. So the step's input
ids do not come from the host: :class:`TokenFeed` keeps ``last[row]``, the token each request row
(``req_to_token`` row) sampled last, in a device buffer the runtime owns
(``GraphRuntime.tokens``). Indexing by request row maps step N's rows to step N+1's rows
whatever joined or left in between: a newly admitted request's row holds the token its prefill
sampled.

**Inside the DECODE program.** A fed DECODE step (``run(batch, feed=runtime.tokens.decode)``)
gives :data:`~graphrt.step.batch.FED` (-1) as every input id. The DECODE program (captured
graph and eager path alike, :func:`graphrt.runtime.programs.fed_forward`) first gathers
``ids[r] = last[req_pool_indices[r]]`` for the rows whose host-written id is ``FED`` and keeps
every other id, then, after sampling, records ``last[req_pool_indices[r]] = token[r]`` for the
same rows (:func:`~graphrt.runtime.programs.fed_sample`). The host-written id is the per-row device flag: it travels in the step's upload, so
one graph per bucket serves fed and unfed steps and a fed step's device work between replays is
only the upload and the engine's token copy. Pad rows hold their pad id 0 (never ``FED``): they
gather nothing, record nothing, and a bucket larger than ``bs`` changes nothing the real rows
get. An unfed step has no negative id (``Batch.check`` refuses them without a gathering feed),
so both ops leave its ids and every request row's ``last`` as they were (the torch record parks
what it does not keep in the dummy entry, which no ``FED`` row reads).

NOTE: one graph per (DECODE, bucket) with the flag, not a fed graph beside each: the graph
count stays what it was (a ladder of B buckets: B DECODE graphs, not 2B) for two small kernels
per replay (the feed's Triton kernels on CUDA, a few torch ops elsewhere); a second set would
double DECODE's capture time and the graph outputs it keeps alive.

A prefill only records its tokens (:attr:`TokenFeed.prefill`, ``gather=False``): its ids come
from the host, and the scatter is a stream-ordered op after the step, an eager EXTEND or a
MIXED graph's replay (:meth:`StepFeed.after`).
Gathered ids come from the model's own sampler (an argmax or an in-graph draw over the
vocabulary), so they are in range by construction.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from graphrt.metadata.base import StepBuffers
from graphrt.runtime.feed_kernel import fused_feed, gather_kernel, record_kernel
from graphrt.step.batch import Batch
from graphrt.step.modes import ForwardMode

#: Modes whose program runs the token feed (``programs.fed_forward``, ``programs.fed_nodes``): a
#: gathering feed needs one.
FED_MODES = frozenset({ForwardMode.DECODE, ForwardMode.TARGET_VERIFY})


class TokenFeed:
    """``last [rows]`` int64 on ``device``: the last token each request row sampled.

    ``rows`` is ``req_to_token``'s rows including the dummy request ``dummy``, which no fed row
    gathers (pad rows hold their pad id) and which the torch record uses as a scratch entry.
    """

    def __init__(self, rows: int, dummy: int, device: torch.device) -> None:
        if not 0 <= dummy < rows:
            raise ValueError(f"dummy row {dummy} is outside the feed's {rows} rows")
        self.last = torch.zeros(rows, dtype=torch.int64, device=device)
        self.dummy = dummy
        self.prefill = StepFeed(self, gather=False)  # prompt ids from the host; record only
        self.decode = StepFeed(self, gather=True)

    def gather(self, ids: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """The step's input ids: ``last[rows[r]]`` where ``ids[r] < 0`` (``FED``), else ``ids[r]``.

        ``ids``, ``rows`` ``[R]`` int64 (one token per request row: DECODE); returns a new
        ``[R]`` int64 tensor and leaves ``ids`` as uploaded (:meth:`record` reads it).
        """
        if fused_feed(ids.device):
            return gather_kernel(self.last, ids, rows)
        return torch.where(ids < 0, self.last.index_select(0, rows), ids)

    def record(self, ids: torch.Tensor, rows: torch.Tensor, sampled: torch.Tensor) -> None:
        """``last[rows[r]] = sampled[r]`` where ``ids[r] < 0``; ``sampled [R]`` int64."""
        if fused_feed(ids.device):
            record_kernel(self.last, ids, rows, sampled)
            return
        # NOTE: other rows write the dummy entry, which no fed row reads (one op, no mask).
        self.last.index_copy_(0, torch.where(ids < 0, rows, self.dummy), sampled)

    def gather_nodes(self, ids: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """A verify's input ids: ``last[rows[r]]`` for every negative id of request row ``r``
        (``FED`` node 0, ``PAD_DRAFT`` drafts), else the id.

        ``ids [R * nodes]`` int64 request-major, ``rows [R]`` int64; returns a new tensor.
        """
        per_node = rows.repeat_interleave(ids.shape[0] // rows.shape[0])
        return torch.where(ids < 0, self.last.index_select(0, per_node), ids)

    def record_bonus(self, ids: torch.Tensor, rows: torch.Tensor, predicted: torch.Tensor) -> None:
        """For request rows whose node 0 is ``FED``: ``last[rows[r]]`` = the target's token after
        the row's accepted chain (the drafts equal to the target's tokens before them, in
        order, as the host's acceptance counts them); other rows write the dummy entry.

        ``ids [R * nodes]`` (as uploaded: ``PAD_DRAFT`` never equals a token), ``rows [R]``,
        ``predicted [R, nodes]`` int64: the target's token after every node (a chain's).
        """
        nodes = ids.view(predicted.shape)
        match = (nodes[:, 1:] == predicted[:, :-1]).to(torch.int64).cumprod(dim=1)
        bonus = predicted.gather(1, match.sum(dim=1, keepdim=True)).squeeze(1)
        self.last.index_copy_(0, torch.where(nodes[:, 0] < 0, rows, self.dummy), bonus)


@dataclass(frozen=True, slots=True)
class StepFeed:
    """What a step does with a :class:`TokenFeed`: ``gather`` its input ids (a fed DECODE: the
    program gathers and records, see the module docstring), or only record (a prefill)."""

    tokens: TokenFeed
    gather: bool

    def check(self, batch: Batch, tokens: TokenFeed | None) -> None:
        """Raise ``ValueError`` unless this feed fits ``batch`` on a runtime holding ``tokens``
        (its graphs read that buffer): ``Batch.sampling`` set, a gathering feed on DECODE."""
        if batch.sampling is None:
            raise ValueError("a token feed records sampled tokens: the batch needs Batch.sampling")
        if self.tokens is not tokens:
            raise ValueError("the token feed is not this runtime's: pass runtime.tokens.decode / .prefill")
        if self.gather and batch.mode not in FED_MODES:
            raise ValueError(
                f"a gathering feed needs DECODE or TARGET_VERIFY, got {batch.mode.name}: "
                "pass runtime.tokens.prefill to record only"
            )
        if self.gather and batch.mode is ForwardMode.TARGET_VERIFY and batch.tree_mask is not None:
            raise ValueError("a fed verify is a chain (topk 1): its node 0 follows the accepted chain")

    def after(self, step: StepBuffers, bs: int, sampled: torch.Tensor) -> None:
        """A recording step (``gather`` off; a gathering one records inside its program):
        ``last[req_pool_indices[r]] = sampled[r]``; ``sampled [bs]`` int64.

        Reads ``req_pool_indices`` before the next step's upload overwrites it (stream order).
        """
        if bs:
            self.tokens.last.index_copy_(0, step.req_pool_indices[:bs], sampled[:bs])
