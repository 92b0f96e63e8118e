"""The engine's side of sampling: admitting a request's parameters, host-side draws, stop tokens.

Tokens are normally sampled inside the runtime's program (``RuntimeConfig(sample=True)``);
:func:`host_tokens` applies the very same sampler to logits the engine already holds (an engine
that records logits, or one whose runtime does not sample), so the tokens are the same either way.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np
import torch

from graphrt.engine.constraints import check_constraint
from graphrt.metadata.sampling import sampling_inputs
from graphrt.runtime.sampler import sample
from graphrt.step.config import RuntimeConfig
from graphrt.step.sampling import GREEDY, MAX_SEED, SamplingParams


def admit_params(
    sampling: SamplingParams | None,
    runtime: RuntimeConfig | None,
    vocab_size: int,
    rng: np.random.Generator,
    constraint: object = None,
) -> SamplingParams | None:
    """Check a request's parameters and give a sampled request without a seed a fresh one.

    Raises ``TypeError`` for anything but ``SamplingParams`` or ``None``, and ``ValueError`` for a
    stop token outside the vocabulary, and for log-probabilities, penalties or a ``constraint``
    the ``runtime`` does not compute (None: a TP engine, which computes none).
    """
    max_logprobs = runtime.logprobs if runtime is not None else 0
    penalties = runtime is not None and runtime.penalties
    check_constraint(constraint, runtime is not None and runtime.token_masks)
    if sampling is None:
        return None
    if not isinstance(sampling, SamplingParams):
        raise TypeError(f"sampling must be a graphrt.SamplingParams or None, got {type(sampling).__name__}")
    sampling.check_vocab(vocab_size)
    if sampling.penalised and not penalties:
        raise ValueError(
            "SamplingParams: presence/frequency/repetition penalties need an engine that keeps token "
            "counts: Engine(penalties=True) (not with speculative, record_logits or tp > 1)"
        )
    if sampling.logprobs is not None and (max_logprobs == 0 or sampling.logprobs > max_logprobs):
        raise ValueError(
            f"SamplingParams.logprobs = {sampling.logprobs}: this engine computes at most "
            f"{max_logprobs} (Engine(max_logprobs=N) with N >= 1 computes them)"
        )
    if sampling.seed is None and not sampling.greedy:
        sampling = dataclasses.replace(sampling, seed=int(rng.integers(0, MAX_SEED, dtype=np.int64)))
    return sampling


def row_params(params: Sequence[SamplingParams | None]) -> tuple[SamplingParams, ...]:
    """One ``SamplingParams`` per request row (``None``: greedy)."""
    return tuple(GREEDY if p is None else p for p in params)


def host_tokens(
    logits: torch.Tensor, params: Sequence[SamplingParams | None], positions: Sequence[int]
) -> list[int]:
    """Tokens from ``logits [R, V]`` held outside the graph; the in-graph sampler's draw.

    All-greedy rows take the plain argmax (greedy decoding exactly as without sampling).
    ``positions [R]``: the position each sampled token takes (the draw's counter).
    """
    if all(p is None or p.greedy for p in params):
        return logits.argmax(dim=-1).tolist()
    return sample(logits, sampling_inputs(row_params(params), positions, logits.device)).tolist()


def until_stop(tokens: list[int], sampling: SamplingParams | None) -> list[int]:
    """``tokens`` up to and including the first stop token of ``sampling``."""
    if sampling is None or not sampling.stop_token_ids:
        return tokens
    stops = set(sampling.stop_token_ids)
    for i, t in enumerate(tokens):
        if t in stops:
            return tokens[: i + 1]
    return tokens
