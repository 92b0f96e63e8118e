"""Lean graphs: a DECODE step whose rows want none of the sampler's extras skips them.

A runtime built with sampler extras (``RuntimeConfig.logprobs``, ``penalties``,
``token_masks``: what ``graphrt serve`` turns on) runs them in every sampling step's graph,
whether a row asked or not: the log-probabilities' ``log_softmax`` and top-k over the
vocabulary, the penalties' gathers, the masks' expansion to ``[R, V]`` (dozens of launches a
step). So such a runtime also captures, per bucket of each mode in
:data:`~graphrt.runtime.variants.LEAN_MODES`, the
mode's program run with an environment without them (:func:`lean_env`): the key's *lean
graph* (:mod:`.variants`, captured with its key, or on the first step that needs it with lazy
capture). A step replays it when none of its rows needs the extras (:class:`VariantChoice`): no
row asks for log-probabilities or has a penalty, and no row's mask is a grammar's. It draws
the tokens the full graph draws: on such rows each extra is an identity (an all-allowed mask,
penalties of 0 and 1, and the sampler computes in float32 either way), and a row's counts are
read only by its own penalties, which it has none of.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping

from graphrt.runtime.fastpath import ModePlan
from graphrt.runtime.programs import StepEnv
from graphrt.runtime.token_mask import TokenMasks
from graphrt.runtime.variants import LEAN, SPLIT, Variants
from graphrt.step.batch import Batch


def lean_env(env: StepEnv) -> StepEnv | None:
    """``env`` without the sampler's extras, or None when it has none (no lean graphs then)."""
    if not env.logprobs and env.counts is None and env.masks is None:
        return None
    return dataclasses.replace(env, logprobs=0, counts=None, masks=None)


class VariantChoice:
    """Which variant of its key a step replays (:mod:`.variants`, called with the step's batch,
    its mode's plan and its ``ready``): the split pair with ``ready``; the lean graph in a mode
    with lean graphs (:attr:`modes`, ``ModePlan.lean``) when :meth:`lean`; else none."""

    def __init__(self, variants: Mapping[str, Variants], masks: TokenMasks | None) -> None:
        self.modes, self.masks = variants[LEAN].modes, masks
        # NOTE: a decode loop passes the same sampling tuple step after step: its answer is kept
        self._params: tuple | None = None
        self._plain = False

    def __call__(self, batch: Batch, plan: ModePlan, ready: Callable[[], None] | None) -> str | None:
        if ready is not None:
            return SPLIT
        return LEAN if plan.lean and self.lean(batch) else None

    def lean(self, batch: Batch) -> bool:
        """Whether no row of ``batch`` needs an extra (the masks' rows: :attr:`TokenMasks.grammar`)."""
        params = batch.sampling
        if params is None:
            return False
        if params is not self._params:
            self._params = params
            self._plain = not any(p.logprobs is not None or p.penalised for p in params)
        return self._plain and (self.masks is None or not self.masks.grammar[batch.req_pool_indices].any())
