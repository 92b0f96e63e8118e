"""What the :class:`~graphrt.runtime.capturer.Capturer` captures with: the engine, each key's graph
shape, the token ladders, the all-padding batch a capture runs on, and freeing a graph."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from graphrt.capture import BucketPolicy, CaptureEngine, EmulatedEngine, SplitGraph
from graphrt.step.batch import Batch
from graphrt.step.config import RuntimeConfig
from graphrt.step.modes import MODES, ForwardMode


def make_engine(name: str | None, device: torch.device, record_kernels: bool) -> CaptureEngine:
    """The capture engine ``name`` (default: CUDA graphs on a CUDA device, else emulated)."""
    name = name or ("cuda" if device.type == "cuda" else "emulated")
    if name == "emulated":
        return EmulatedEngine()
    if name == "cuda" and device.type == "cuda":
        from graphrt.capture.cuda import CudaEngine

        return CudaEngine(device, record_kernels)
    raise ValueError(f"capture engine {name!r} is not usable on {device}; use 'cuda' or 'emulated'")


@dataclass(frozen=True, slots=True)
class GraphShape:
    """What a graph ``(mode, bucket)`` holds: ``rows`` requests, ``tokens`` token rows, and the
    ``max_seqlen_q`` its kernels receive (a function of the key, rule 4)."""

    rows: int
    tokens: int
    max_q: int


def token_ladders(config: RuntimeConfig) -> dict[ForwardMode, BucketPolicy]:
    """The token ladder of each token-bucketed mode (MIXED), from ``config.token_buckets``."""
    if not config.token_buckets:
        return {}
    ladder = BucketPolicy.exact(config.token_buckets, config.max_tokens)
    return {mode: ladder for mode, spec in MODES.items() if spec.token_bucket}


def empty_batch(mode: ForwardMode) -> Batch:
    """A batch of no requests: capture runs on all-padding rows."""
    empty = np.zeros(0, dtype=np.int64)
    return Batch(mode, empty, empty, empty, empty, empty)


def alone(ok: bool, what: str) -> bool:
    """The agreement of a group of one rank: its own outcome."""
    return ok


def reset_graph(graph: Any) -> None:
    """Free a CUDA graph's instantiation now (an emulated graph has none; a split pair: both)."""
    for part in graph.parts if isinstance(graph, SplitGraph) else (graph,):
        reset = getattr(getattr(part, "graph", None), "reset", None)
        if reset is not None:
            reset()


def host_scalars(
    config: RuntimeConfig, backend: Any, env: Any, mode: ForwardMode, max_q: int, cascade: bool
) -> dict[str, Any]:
    """Every Python value the step's kernels receive (the attention backend's, the model's
    per-layer scalars in ``env.scalars``), all functions of the graph key."""
    found: dict[str, Any] = {"max_seqlen_q": max_q, "page_size": config.page_size, "cascade": cascade}
    if MODES[mode].draft_steps and config.speculative:
        found["draft_steps"] = config.speculative.draft_forwards
    return found | backend.host_scalars() | env.scalars.as_dict()
