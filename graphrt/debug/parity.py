"""Graph vs eager on the same batch: the largest difference and where it first appears."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch

from graphrt.capture import Fallback, Pending
from graphrt.debug.schema import ParityResult
from graphrt.step.batch import Batch
from graphrt.step.modes import ForwardMode

if TYPE_CHECKING:
    from graphrt.runtime import GraphRuntime


def default_tol(dtype: torch.dtype) -> float:
    # NOTE: same kernels on both paths, so fp32 agrees to rounding; bf16 outputs carry
    # ~3 significant digits and logits of a few units.
    return 1e-4 if dtype == torch.float32 else 5e-2


def check_parity(runtime: GraphRuntime, batch: Batch, tol: float | None = None) -> ParityResult:
    """Run ``batch`` through its graph and eagerly; compare the outputs of the real tokens.

    Raises ``ValueError`` when no graph fits the batch (it would run eagerly twice); a pending
    one (lazy capture) is captured by the graph run.
    """
    chosen = runtime.dispatcher.select(batch.mode, batch.bs)
    if isinstance(chosen, Fallback):
        raise ValueError(f"no graph for {batch.mode.name} bs={batch.bs}: {chosen.reason}")
    bucket = chosen.bucket if isinstance(chosen, Pending) else chosen[0]
    graph = runtime.run(batch).float()
    eager = runtime.run(batch, eager=True).float()
    diff = (graph - eager).abs().reshape(graph.shape[0], -1).cpu().numpy()
    tol = default_tol(runtime.kv.dtype) if tol is None else tol
    return _result(batch.mode.name, bucket, batch.bs, diff, tol)


def _result(mode: str, bucket: int, bs: int, diff: np.ndarray, tol: float) -> ParityResult:
    if diff.size == 0:
        return ParityResult(mode, bucket, bs, 0.0, tol, None, None)
    diff = np.nan_to_num(diff, nan=np.inf)
    bad = np.argwhere(diff > tol)
    first = (int(bad[0][0]), int(bad[0][1])) if len(bad) else None
    worst = np.unravel_index(int(diff.argmax()), diff.shape)
    return ParityResult(mode, bucket, bs, float(diff.max()), tol, first, (int(worst[0]), int(worst[1])))


def probe_sizes(buckets: tuple[int, ...]) -> list[tuple[int, int]]:
    """``(bucket, bs)`` per bucket with ``bs`` one above the previous bucket, so pad rows exist."""
    return [(b, (buckets[i - 1] + 1) if i else b) for i, b in enumerate(buckets)]


def parity_sweep(runtime: GraphRuntime, seed: int = 0, prompt_len: int = 24) -> tuple[ParityResult, ...]:
    """Prefill fresh requests and check one DECODE step per bucket (pending ones captured).

    Uses request rows ``0..bs`` and their contiguous pages (``row * max_pages ...``), so it
    overwrites their KV: run it on an idle runtime (after a demo, in tests). Modes other than
    DECODE are skipped: their batches need mode-specific geometry.
    """
    if ForwardMode.DECODE not in runtime.dispatcher.graphed_modes():
        return ()
    rng = np.random.default_rng(seed)
    prompt_len = min(prompt_len, runtime.config.max_context_len - 1)
    results = []
    for bucket, bs in probe_sizes(runtime.dispatcher.policy.buckets):
        lens = rng.integers(max(1, prompt_len // 2), prompt_len + 1, bs)
        _prefill(runtime, lens, rng)
        results.append(check_parity(runtime, _decode(runtime, lens, rng)))
        assert results[-1].bucket == bucket
    return tuple(results)


def _slots(runtime: GraphRuntime, req: int, positions: np.ndarray) -> np.ndarray:
    ps, pages = runtime.config.page_size, runtime.config.max_pages
    slots = (req * pages + positions // ps) * ps + positions % ps
    if slots.size and slots.max() >= runtime.kv.num_live_slots:
        raise ValueError(f"request row {req} has no contiguous pages in this KV cache")
    return slots


def _vocab(runtime: GraphRuntime) -> int:
    return runtime.limits.vocab_size or 2


def _prefill(runtime: GraphRuntime, lens: np.ndarray, rng: np.random.Generator) -> None:
    reqs = np.arange(len(lens))
    batch = Batch.create(
        ForwardMode.EXTEND,
        input_ids=rng.integers(0, _vocab(runtime), int(lens.sum())),
        seq_lens=lens,
        req_pool_indices=reqs,
        out_cache_loc=np.concatenate(
            [_slots(runtime, r, np.arange(n)) for r, n in zip(reqs, lens, strict=True)]
        ),
        q_lens=lens,
    )
    runtime.run(batch)


def _decode(runtime: GraphRuntime, lens: np.ndarray, rng: np.random.Generator) -> Batch:
    reqs = np.arange(len(lens))
    return Batch.create(
        ForwardMode.DECODE,
        input_ids=rng.integers(0, _vocab(runtime), len(lens)),
        seq_lens=lens + 1,
        req_pool_indices=reqs,
        out_cache_loc=np.concatenate(
            [_slots(runtime, r, np.array([n])) for r, n in zip(reqs, lens, strict=True)]
        ),
    )
