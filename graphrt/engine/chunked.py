"""Chunked prefill: a long prompt prefills a token budget per step, beside the decode rows.

With ``EngineConfig.prefill_chunk = B`` a step holds every running request that decodes (one
token each) and then chunks of the prompts still prefilling, in admission order, until the
step holds ``B`` tokens (a prefilling request gets at least one token per step, so it always
advances). Such a *mixed* step is one MIXED batch (a graph per token bucket; EXTEND, eager,
in an engine without graphs): a decode row is a query of one token at the end of its KV
(``q_lens = 1``), a chunk a query of ``q`` tokens after the ``p`` positions its row already
holds (``seq_lens = p + q``), so one varlen paged attention serves both. A decode row and a
prompt's last chunk give their request its next token; an earlier chunk's draw is dropped.
Tokens equal an unchunked prefill's: a chunk attends to the KV its earlier chunks wrote, as the
whole prompt would, and a request's penalty counts and grammar mask start right before the step
of its last chunk (``StepExtras.before``), as before a whole-prompt prefill, so its penalties,
mask and log-probabilities are those of an unchunked prefill too.

Without chunking, a whole-prompt prefill step is such a batch without decode rows, and replays
the same MIXED graphs where it fits one (:mod:`.prefill`, ``EngineConfig.prefill_graph_tokens``);
with chunking every prefill step is a chunked one, on this module's ladder.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from graphrt.engine.sampling import row_params
from graphrt.step.batch import Batch
from graphrt.step.modes import ForwardMode


@dataclass(frozen=True, slots=True)
class MixedStep:
    """One chunked step: ``reqs`` in batch order (decode rows, then chunks), ``chunks [n]``
    int64 prompt tokens each request's row computes (0: a decode row), ``emits [n]`` bool
    (the row's last token gives the request's next token), ``decodes``: how many rows decode."""

    batch: Batch
    reqs: list[Any]
    chunks: np.ndarray
    emits: np.ndarray
    decodes: int

    @property
    def starting(self) -> list[Any]:
        """The requests whose prompt's last chunk the step holds: it samples their first token."""
        return [r for r, q, e in zip(self.reqs, self.chunks, self.emits, strict=True) if q and e]


def prefilling(r: Any) -> bool:
    """Whether request ``r`` still has prompt tokens to prefill."""
    return r.prefilled < len(r.prompt)


def plan_step(
    running: Sequence[Any], budget: int, page_size: int, sampled: bool, mode: ForwardMode = ForwardMode.EXTEND
) -> MixedStep | None:
    """The next chunked step of ``running`` as a batch of ``mode`` (MIXED where the runtime
    graphs it), or None when no request is prefilling (a plain DECODE step, which replays its
    graph)."""
    chunked = [r for r in running if r.req_idx >= 0 and prefilling(r)]
    if not chunked:
        return None
    decoding = [r for r in running if r.req_idx >= 0 and not r.done and not prefilling(r)]
    left = max(budget - len(decoding), 1)
    reqs, ids, seq_lens, q_lens, locs = list(decoding), [], [], [], []
    for r in decoding:
        n = len(r.prompt) + len(r.output)
        ids.append([r.output[-1]])
        seq_lens.append(n)
        q_lens.append(1)
        locs.append(r.slots(n - 1, n, page_size))
    chunks = [0] * len(decoding)
    for r in chunked:
        if left <= 0:
            break
        p = r.prefilled
        q = min(len(r.prompt) - p, left)
        left -= q
        reqs.append(r)
        ids.append(r.prompt[p : p + q])
        seq_lens.append(p + q)
        q_lens.append(q)
        locs.append(r.slots(p, p + q, page_size))
        chunks.append(q)
    batch = Batch.create(
        mode,
        input_ids=np.concatenate([np.asarray(t, dtype=np.int64) for t in ids]),
        seq_lens=seq_lens,
        req_pool_indices=[r.req_idx for r in reqs],
        out_cache_loc=np.concatenate(locs),
        q_lens=q_lens,
        sampling=row_params([r.sampling for r in reqs]) if sampled else None,
    )
    done = np.array([r.prefilled + c >= len(r.prompt) for r, c in zip(reqs, chunks, strict=True)])
    return MixedStep(batch, reqs, np.asarray(chunks, dtype=np.int64), done, len(decoding))
