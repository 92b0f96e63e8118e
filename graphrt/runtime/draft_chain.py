"""DRAFT_DECODE's program: every draft step of a chain (or tree) in one graph.

A row of :data:`graphrt.runtime.programs.PROGRAMS`; it reads the step's inputs and the
program environment (:class:`~graphrt.runtime.programs.StepEnv`) as every program does.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol

import torch

from graphrt.metadata.base import StepMetadata
from graphrt.metadata.buffer_groups import StepInputs
from graphrt.metadata.cascade import derive_prefix, draft_step_cascade
from graphrt.metadata.step import derive_draft
from graphrt.step.modes import ForwardMode


class DraftEnv(Protocol):
    """What the chain reads of :class:`~graphrt.runtime.programs.StepEnv` (named here, not
    imported: the program table imports this module)."""

    req_to_token: Any
    page_size: int

    def derive_window(self, b: Any, loc: torch.Tensor, inputs: StepInputs) -> None: ...

    def call(
        self,
        buffers: Any,
        meta: StepMetadata,
        input_ids: torch.Tensor,
        inputs: StepInputs,
        draft_step: int = 0,
    ) -> torch.Tensor: ...


def draft_loop(env: DraftEnv, mode: ForwardMode, inputs: StepInputs, max_q: int) -> torch.Tensor:
    """DRAFT_DECODE: every draft step in one graph, each step's token the argmax of the last.

    Step ``i`` of a chain attends ``seq_len + i`` keys through the page table; in a tree
    (``topk > 1``) each branch attends the shared prefix plus its own draft slots ``0..i``.
    Returns the draft tokens ``[T, steps]`` int64.
    """
    b, draft = inputs.step, inputs.draft
    assert draft is not None, "DRAFT_DECODE needs the draft buffer group"
    loc = draft.draft_loc
    steps = [
        dataclasses.replace(
            b, positions=b.positions + i, out_cache_loc=loc[:, i], cache_seqlens=b.cache_seqlens + i
        )
        for i in range(loc.shape[1])
    ]
    tree = inputs.cascade is not None
    derive_draft(b, loc, env.req_to_token, env.page_size, tree)
    env.derive_window(b, loc, inputs)
    if tree:
        derive_prefix(inputs.cascade, b.cache_seqlens, 1)
    tokens, out = b.input_ids, []
    for i, step in enumerate(steps):
        cascade = draft_step_cascade(inputs.cascade, loc, i) if tree else None
        meta = StepMetadata(mode, step, max_q, env.page_size, cascade)
        logits = env.call(step, meta, tokens, inputs, i)
        tokens = logits.argmax(dim=-1)
        out.append(tokens)
    return torch.stack(out, dim=1)
