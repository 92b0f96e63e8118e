"""What a step does for its requests besides their tokens: grammar masks written before it,
log-probabilities attached and grammar states advanced after it.

Both are off the hot path unless a request asks (``SamplingParams.logprobs``, a
``constraint``): the scheduler keeps per running set whether any does.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from graphrt.engine.constraints import Constraints, accept
from graphrt.engine.logprobs import attach, host_packed

if TYPE_CHECKING:
    from graphrt.engine.request import Request


class StepExtras:
    """The extras of ``runtime``'s steps (its masks, its in-graph log-probabilities)."""

    def __init__(self, runtime: Any) -> None:
        self.runtime = runtime
        self.masks = Constraints(getattr(getattr(runtime, "env", None), "masks", None))

    def before(self, reqs: Sequence[Request], *, fresh: bool = False) -> None:
        """Write the masks of ``reqs``' constrained rows (``fresh``: a prefill; every row)."""
        self.masks.write(reqs, fresh=fresh)

    def after(
        self,
        reqs: Sequence[Request],
        tokens: np.ndarray,
        *,
        logprobs: bool,
        constrained: bool,
        packed: np.ndarray | None = None,
        logits: torch.Tensor | None = None,
    ) -> None:
        """Once the step's ``tokens [R]`` are appended: log-probabilities (``packed`` as read,
        else the runtime's last, else from host-held ``logits [R, V]``), grammar states."""
        if logprobs:
            attach(reqs, tokens, packed if packed is not None else self._packed(tokens, logits))
        if constrained:
            accept(reqs)

    def _packed(self, tokens: np.ndarray, logits: torch.Tensor | None) -> np.ndarray | None:
        k = self.runtime.config.logprobs
        if logits is None:
            found = self.runtime.logprobs
        else:
            found = host_packed(logits, tokens.tolist(), k) if k else None
        return None if found is None else found.float().cpu().numpy()
