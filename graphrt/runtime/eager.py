"""The eager path of a step: groups built at the batch's exact size, the program run directly.

``run()`` takes it when no graph fits the batch (counted, with the reason), when asked
(``eager=True``) and for modes that are never graphed. Graph and eager paths share every
write and derive function, so their outputs match.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from graphrt.metadata.buffer_groups import BufferGroups
from graphrt.runtime.fastpath import ModePlan, select
from graphrt.runtime.feed import StepFeed
from graphrt.runtime.programs import PROGRAMS, StepEnv
from graphrt.step.batch import Batch

#: What ``GraphRuntime.run(ready=)`` calls after a step's metadata write: before its launch, or
#: between the forward and sampler graphs of a split pair (:mod:`.split_pairs`).
Ready = Callable[[], None]


def run_eager(
    batch: Batch,
    plan: ModePlan,
    groups: BufferGroups,
    env: StepEnv,
    feed: StepFeed | None = None,
    ready: Ready | None = None,
) -> tuple[torch.Tensor, Any]:
    """Run ``batch`` eagerly; returns what the graph path returns (a fresh tensor), and the
    program's whole output. ``ready``: called once the step's metadata is written."""
    pad = plan.pad
    # NOTE: an IDLE step still runs one all-padding row (as its graph does), so a model
    # with collectives or side effects sees the same call shape either way.
    inputs = groups.exact(batch, max(batch.bs, 1))
    max_q = int(batch.q_lens.max()) if batch.bs else pad["pad_q_len"]
    if ready is not None:
        ready()
    with torch.no_grad():
        # NOTE: a gathering feed runs inside the program (FED ids), as on the graph path.
        raw = PROGRAMS[batch.mode](env, batch.mode, inputs, max_q)
        out = select(raw, batch.sampling is not None, batch.bs, batch.num_tokens, plan.last_rows)
        if feed is not None and not feed.gather:
            feed.after(inputs.step, batch.bs, out)
    return out, raw
