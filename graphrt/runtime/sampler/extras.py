"""A sampling step with its extras: token masks and penalties before the draw, counts and
log-probabilities after it (:func:`sample_with_extras`).

The torch code (:meth:`TokenMasks.apply`, :meth:`TokenCounts.apply` and
:meth:`TokenCounts.count`, :func:`step_logprobs`) is the CPU path and the oracle. On CUDA
(``GRAPHRT_FUSED_SAMPLER`` not ``0``, the switch of the whole in-graph sampler) the extras run
as two Triton launches around the draw instead
(:mod:`graphrt.runtime.sampler.extras_kernel`): the torch code takes about 25 launches a step,
most of them elementwise passes over ``[R, V]`` (the masks' bits expanded to a bool tensor, the
penalties' gathers, a full log-softmax and a radix top-k). Both give the same ``z`` bit for bit,
the same counts, and log-probabilities equal within float32 rounding (the kernel's log-sum-exp
adds the chunks' sums in another order).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from graphrt.kernels.switches import triton
from graphrt.metadata.sampling import SamplingBuffers
from graphrt.runtime.logprobs import step_logprobs
from graphrt.runtime.penalties import TokenCounts
from graphrt.runtime.sampler import extras_kernel
from graphrt.runtime.sampler.draw import fused_sampler, sample
from graphrt.runtime.token_mask import TokenMasks

#: Vocabulary entries a ``_before`` program takes without log-probabilities (one pass).
CHUNK = 1024
WARPS = 4


def chunk_for(vocab: int, k: int) -> int:
    """Entries a ``_before`` program takes: a row's top-``k`` is ``k`` reductions over each chunk
    and then ``k`` over the chunks' ``k`` best each, one after another, so the two are balanced:
    the power of two nearest ``sqrt(vocab * k)``, in 256..4096."""
    if not k:
        return CHUNK
    return min(4096, max(256, 1 << round(math.log2(math.sqrt(vocab * k)))))


def sample_with_extras(
    logits: torch.Tensor,
    rows: torch.Tensor,
    params: SamplingBuffers,
    masks: TokenMasks | None = None,
    counts: TokenCounts | None = None,
    k: int = 0,
    fused: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(tokens [R] int64, logprobs [R, 1 + 2k] float32 or None)`` drawn from ``logits [R, V]``.

    ``rows [R]``: each row's request row (``req_to_token``), whose mask (``masks``) and counts
    (``counts``) apply; the drawn tokens are counted. ``k``: the best tokens' log-probabilities
    to report (0: none), from the raw logits (:func:`step_logprobs`). ``fused``: the Triton
    kernels or the torch code (default: the sampler's switch, :func:`fused_sampler`). Graph-safe.
    """
    fused = fused_sampler(logits.device) if fused is None else fused
    if fused and (masks is not None or counts is not None or k) and logits.shape[0]:
        logits = logits if logits.stride(-1) == 1 else logits.contiguous()
        before = before_draw(logits, rows, params, masks, counts, k)
        tokens = sample(before.z, params)
        return tokens, after_draw(logits, rows, tokens, before, counts, k)
    z = logits if masks is None else masks.apply(logits, rows)
    if counts is not None:
        # NOTE: a row's counts start over outside the graph (TokenCounts.start), whatever
        # the mode of the step that samples its request's first token
        tokens = sample(counts.apply(z, rows, params), params)
        counts.count(rows, tokens)
    else:
        tokens = sample(z, params)
    return tokens, step_logprobs(logits, tokens, k) if k else None


@dataclass(frozen=True, slots=True)
class Before:
    """What ``_before`` leaves for the draw and for ``_after``."""

    z: torch.Tensor  # [R, V] float32: masks and penalties applied (the logits if neither)
    maxima: torch.Tensor  # [R, chunks] float32: each chunk's largest raw logit
    sums: torch.Tensor  # [R, chunks] float32: each chunk's sum(exp(x - its maximum))
    keys: torch.Tensor  # [R, chunks, max(k, 1)] int64: each chunk's k best (value, ~id) keys


def _launch(k: int, device: torch.device) -> dict:
    # NOTE: no a*b+c contracted into an FMA: every float32 step rounds as torch's does
    return {"K": k, "ACCURATE": device.type == "cuda", "num_warps": WARPS, "enable_fp_fusion": False}


def before_draw(
    logits: torch.Tensor,
    rows: torch.Tensor,
    params: SamplingBuffers,
    masks: TokenMasks | None,
    counts: TokenCounts | None,
    k: int,
) -> Before:
    """``_before`` over contiguous ``logits [R, V]``: see :class:`Before`."""
    assert triton is not None, "the fused extras need Triton"
    r, vocab = logits.shape
    chunks = triton.cdiv(vocab, chunk := chunk_for(vocab, k))
    f32 = {"dtype": torch.float32, "device": logits.device}
    write = masks is not None or counts is not None
    out = Before(
        z=torch.empty(r, vocab, **f32) if write else logits,
        maxima=torch.empty(r, chunks, **f32),
        sums=torch.empty(r, chunks, **f32),
        keys=torch.empty(r, chunks, max(k, 1), dtype=torch.int64, device=logits.device),
    )
    penalties = (params.repetition_penalty, params.frequency_penalty, params.presence_penalty)
    words = masks.masks if masks is not None else out.z
    cnt = (counts.counts, counts.prompt) if counts is not None else (out.z, out.z)
    extras_kernel._before[(r, chunks)](
        logits, logits.stride(0), vocab, rows, words, words.shape[-1], *cnt, *penalties, out.z,
        out.maxima, out.sums, out.keys, S=chunks, C=chunk, MASKS=masks is not None,
        PENALTIES=counts is not None, **_launch(k, logits.device),
    )  # fmt: skip
    return out


def after_draw(
    logits: torch.Tensor,
    rows: torch.Tensor,
    tokens: torch.Tensor,
    before: Before,
    counts: TokenCounts | None,
    k: int,
) -> torch.Tensor | None:
    """``_after``: ``tokens [R]`` counted, and their packed log-probabilities (``k`` > 0)."""
    assert triton is not None, "the fused extras need Triton"
    r, chunks = before.maxima.shape
    lp = torch.empty(r, 1 + 2 * k, dtype=torch.float32, device=logits.device) if k else None
    if counts is not None or k:
        extras_kernel._after[(r,)](
            logits, logits.stride(0), logits.shape[1], rows, tokens,
            counts.counts if counts is not None else before.z, before.maxima, before.sums, before.keys,
            lp if lp is not None else before.z, S=chunks, S_PAD=triton.next_power_of_2(chunks),
            KS_PAD=triton.next_power_of_2(chunks * max(k, 1)), COUNT=counts is not None,
            **_launch(k, logits.device),
        )  # fmt: skip
    return lp
