"""Greedy decoding through the runtime, each decode step eager and graphed on the same KV.

The tensor-parallel MoE tests run it on every rank and at TP=1: one bucket, one captured mode
(DECODE), so a step costs few collectives on a loaded CPU. Imports no transformers: a spawned
rank unpickles :func:`tp_greedy` (and the GPU test's :func:`tp_forced`) from here.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from graphrt import Batch, ForwardMode, RuntimeConfig
from graphrt.checkpoints import load
from graphrt.engine.stack import stack_for
from graphrt.parallel import init_tp
from tests.support.hf_util import run_graphrt, sequences

PAGE_SIZE, MAX_CONTEXT = 16, 32


@dataclass(frozen=True, slots=True)
class GreedyRun:
    """Logits rows ``[rows, vocab]`` float32 (numpy: a rank sends them by value): the prefill's,
    then per decode step the eager step's and the graphed step's; the greedy tokens per prompt."""

    prefill: np.ndarray
    eager: list[np.ndarray]
    graphed: list[np.ndarray]
    tokens: list[list[int]]

    def rows(self) -> list[torch.Tensor]:
        return [torch.from_numpy(r) for r in (self.prefill, *self.eager, *self.graphed)]


def _slots(req: int, positions: range, pages: int) -> list[int]:
    return [(req * pages + p // PAGE_SIZE) * PAGE_SIZE + p % PAGE_SIZE for p in positions]


def greedy_run(model: torch.nn.Module, prompts: list[list[int]], new: int) -> GreedyRun:
    """``new`` greedy tokens per prompt, the prompts batched (EXTEND, then ``new - 1`` DECODE steps)."""
    n = len(prompts)
    config = RuntimeConfig(
        max_batch_size=n, max_context_len=MAX_CONTEXT, page_size=PAGE_SIZE, buckets=(n,), warmup=1
    )
    stack = stack_for(model, config)
    stack.runtime.capture()
    pages, lens = config.max_pages, [len(p) for p in prompts]
    prefill = Batch.create(
        ForwardMode.EXTEND,
        input_ids=np.concatenate(prompts),
        seq_lens=lens,
        req_pool_indices=list(range(n)),
        out_cache_loc=[x for r, m in enumerate(lens) for x in _slots(r, range(m), pages)],
        q_lens=lens,
    )
    rows = stack.runtime.run(prefill).float().cpu()
    tokens = [[t] for t in rows[np.cumsum(lens) - 1].argmax(-1).tolist()]
    eager, graphed = [], []
    for step in range(new - 1):
        at = [m + step for m in lens]  # NOTE: the position of the token each request feeds
        batch = Batch.create(
            ForwardMode.DECODE,
            input_ids=[t[-1] for t in tokens],
            seq_lens=[a + 1 for a in at],
            req_pool_indices=list(range(n)),
            out_cache_loc=[_slots(r, range(a, a + 1), pages)[0] for r, a in enumerate(at)],
        )
        eager.append(stack.runtime.run(batch, eager=True).float().cpu().numpy())
        graphed.append(stack.runtime.run(batch).float().cpu().numpy())
        for t, nxt in zip(tokens, graphed[-1].argmax(-1).tolist(), strict=True):
            t.append(nxt)
    assert stack.runtime.stats().replays, "no decode step replayed a graph"
    return GreedyRun(rows.numpy(), eager, graphed, tokens)


def tp_greedy(rank: int, world: int, path: str, prompts: list[list[int]], new: int) -> GreedyRun:
    """:func:`greedy_run` of this rank's shard of checkpoint ``path`` (CPU, TP=``world``)."""
    group = init_tp(world, torch.device("cpu"))
    return greedy_run(load(path, device=group.device, tp=group), prompts, new)


def forced_rows(model: torch.nn.Module) -> list[np.ndarray]:
    """:func:`tests.support.hf_util.run_graphrt`'s logits rows (fixed sequences: no greedy
    feedback, so bf16 runs stay comparable after a near-tie), prefill then graphed then eager."""
    run = run_graphrt(model, sequences(model.vocab_size))
    return [r.numpy() for r in (*run.prefill, *run.decode_graph, *run.decode_eager)]


def tp_forced(rank: int, world: int, path: str, device: str) -> list[np.ndarray]:
    """:func:`forced_rows` of this rank's shard of ``path`` (``device``'s default dtype)."""
    group = init_tp(world, torch.device(device))
    return forced_rows(load(path, device=group.device, tp=group))
