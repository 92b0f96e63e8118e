"""Split pairs: a sampling program captured as two graphs, so a constrained step's masks are
written while its forward runs.

A step that follows a grammar needs the token of the step in flight accepted before its own
mask exists; an overlapped engine does that in ``GraphRuntime.run(ready=...)``. With one graph
per step (forward and sampler together) the GPU idles while ``ready`` reads, accepts, fills and
uploads. So a runtime with token masks (``RuntimeConfig.token_masks``) also captures, per bucket
of each mode in ``programs.SPLITS`` (DECODE: the only mode a ``ready`` comes with; a prefill or
MIXED step writes its masks before its metadata, from grammar states it already holds), the
mode's :class:`~graphrt.runtime.programs.SplitProgram` as a pair: the forward graph (everything
up to the logits, the token feed's gather included) and the sampler graph (masks, penalties,
the draw, log-probabilities, the feed's record), captured one after the other into the engine's
one pool, the sampler reading the forward's static logits. A step with ``ready`` replays the
forward, calls ``ready`` while it runs, then replays the sampler
(:class:`graphrt.capture.SplitGraph`); a step without one replays the mode's single graph, so
unconstrained serving launches what it did. Both run the same ops: tokens are identical.

The pair costs a second capture of the mode's buckets and the forward's static logits
(``[bucket, V]`` per bucket) beside the single graph's; a runtime without token masks captures
none. Eager capture records a key's pair right after its graph; lazy capture records it on the
first constrained step of the key (``capture_pending`` records the missing ones). A pair whose
capture failed is logged, and its key's constrained steps replay the single graph, ``ready``
first (correct, not overlapped). The capture report lists the parts under the keys
``(mode, bucket, "forward")`` and ``(mode, bucket, "sampler")``.
"""

from __future__ import annotations

from typing import Any

import torch

from graphrt.capture import CaptureEngine, SplitGraph
from graphrt.metadata.buffer_groups import StepInputs
from graphrt.runtime.programs import SplitProgram, StepEnv
from graphrt.runtime.variants import Key, Made


def record_pair(
    engine: CaptureEngine,
    split: SplitProgram,
    env: StepEnv,
    key: Key,
    inputs: StepInputs,
    max_q: int,
    warmup: int,
    scalars: dict[str, Any],
) -> Made:
    """Capture ``split`` for ``key`` (``(mode, bucket)``) on ``inputs`` (the bucket's views,
    written with an all-padding batch) as the forward graph, then the sampler graph reading the
    forward's static logits; each part records the key's host ``scalars``."""
    mode = key[0]

    def forward() -> Any:
        with torch.no_grad():  # NOTE: no autograd state may be recorded into the graph
            return split.forward(env, mode, inputs, max_q)

    first, logits = engine.capture((*key, "forward"), forward, warmup)
    # NOTE: a CUDA capture runs nothing: the sampler's warm-up must read real logits (a draw
    # on uninitialised memory could fault). The replay writes only the dummy slot.
    first.replay()
    first.info.replays -= 1  # NOTE: not a step's

    def sampler() -> Any:
        with torch.no_grad():
            return split.sample(env, mode, inputs, max_q, logits)

    second, out = engine.capture((*key, "sampler"), sampler, warmup)
    first.info.host_scalars, second.info.host_scalars = scalars, dict(scalars)
    return SplitGraph(first, second, keep=logits), out
