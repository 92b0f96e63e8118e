"""What a step does for its requests besides their tokens: grammar masks written and penalty
counts started before it, log-probabilities attached and grammar states advanced after it.

Requests *start* before the step that samples their first token (a whole-prompt EXTEND, or
the MIXED step holding a prompt's last chunk): their mask rows are written (all-allowed where
unconstrained) and their token-count rows (:class:`~graphrt.runtime.penalties.TokenCounts`)
start over with their whole prompt marked. Both are device writes ordered before the step on
the stream, outside any graph, so a step of any mode (graphed or not) finds them ready.
The rest is off the hot path unless a request asks (``SamplingParams.logprobs``, a
``constraint``): the scheduler keeps per running set whether any does.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from graphrt.engine.constraints import Constraints, accept
from graphrt.engine.logprobs import attach, host_packed
from graphrt.runtime.penalties import TokenCounts

if TYPE_CHECKING:
    from graphrt.engine.request import Request


class StepExtras:
    """The extras of ``runtime``'s steps (its masks, its in-graph log-probabilities)."""

    def __init__(self, runtime: Any) -> None:
        self.runtime = runtime
        env = getattr(runtime, "env", None)
        self.masks = Constraints(getattr(env, "masks", None))
        self.counts: TokenCounts | None = getattr(env, "counts", None)

    def before(self, reqs: Sequence[Request], *, fresh: bool = False) -> None:
        """Write the masks of ``reqs``' constrained rows; ``fresh``: ``reqs`` start (their
        next step samples their first token): every row's mask, and their counts start over."""
        self.masks.write(reqs, fresh=fresh)
        if fresh and self.counts is not None and reqs:
            self.counts.start([r.req_idx for r in reqs], [r.prompt for r in reqs])

    def after(
        self,
        reqs: Sequence[Request],
        tokens: np.ndarray,
        *,
        logprobs: bool,
        constrained: bool,
        packed: np.ndarray | None = None,
        logits: torch.Tensor | None = None,
        rows: np.ndarray | None = None,
    ) -> None:
        """Once the step's ``tokens [R]`` are appended: log-probabilities (``packed`` as read,
        else the runtime's last step's rows ``rows`` (a bool mask or indices; None: all), else
        from host-held ``logits [R, V]``), grammar states."""
        if logprobs:
            attach(reqs, tokens, packed if packed is not None else self._packed(tokens, logits, rows))
        if constrained:
            accept(reqs)

    def _packed(
        self, tokens: np.ndarray, logits: torch.Tensor | None, rows: np.ndarray | None
    ) -> np.ndarray | None:
        k = self.runtime.config.logprobs
        if logits is None:
            found = self.runtime.logprobs
        else:
            found = host_packed(logits, tokens.tolist(), k) if k else None
            rows = None  # NOTE: the host-held logits are the requests' rows already
        if found is None:
            return None
        packed = found.float().cpu().numpy()
        return packed if rows is None else packed[rows]
