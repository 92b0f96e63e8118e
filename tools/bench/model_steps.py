"""The steps the model bench times: the weight-read floor, graphrt's graphed DECODE, and
transformers' decode with a static cache (eager, and under ``torch.compile``).

Every measured step is the *same* step repeated: graphrt re-runs one DECODE batch (it writes
the same KV slot each time); transformers' cache is rewound to the context length before each
call (untimed), so every call writes the same slot and attends over the same keys.
"""

from __future__ import annotations

import argparse
import inspect
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from graphrt import Batch, ForwardMode, RuntimeConfig
from graphrt.capture.topology import cuda_bindings_missing
from graphrt.engine.stack import ModelStack, stack_for
from graphrt.models.llama import TinyLlama
from graphrt.tools.bench.decode import PAGE_SIZE, slots
from graphrt.tools.bench.record import percentiles, time_us

FLOOR_DEFINITION = (
    "floor_us = read_bytes / bandwidth: the time to read the weights a decode step reads once at "
    "the device's measured copy bandwidth; bandwidth = 2 * copy_bytes / copy time (p50 over iters, "
    "CUDA events), dst.copy_(src) of a flat bf16 tensor of copy_bytes = read_bytes, which reads "
    "copy_bytes and writes copy_bytes; so floor_us = copy p50 / 2"
)


def capacity(context: int) -> int:
    """KV positions both sides allocate per request: the context plus one decode token, rounded
    up to a whole page (so transformers' SDPA sees an aligned key length)."""
    return -(-(context + 1) // PAGE_SIZE) * PAGE_SIZE


def _copy_us(nbytes: int, device: torch.device, iters: int) -> dict[str, float]:
    """p10/p50/p90 µs of ``dst.copy_(src)`` over flat bf16 tensors of ``nbytes`` each."""
    src = torch.zeros(nbytes // 2, dtype=torch.bfloat16, device=device)
    dst = torch.empty_like(src)
    return percentiles(time_us(lambda: dst.copy_(src), iters, device))


def weight_floor(read_bytes: int, device: torch.device, iters: int) -> dict[str, Any]:
    """Measure the copy of ``read_bytes`` bytes (:data:`FLOOR_DEFINITION`); frees its buffers."""
    copy = _copy_us(read_bytes, device, iters)
    if device.type == "cuda":
        torch.cuda.empty_cache()  # NOTE: 2x the weights; the models need the room
    bandwidth = 2 * read_bytes / (copy["p50"] * 1e-6)
    return {
        "definition": FLOOR_DEFINITION,
        "copy_bytes": read_bytes,
        "copy_us": copy,
        "bandwidth_gb_s": bandwidth / 1e9,
        "floor_us": copy["p50"] / 2,
    }


# ---- graphrt -------------------------------------------------------------------------------
def graphrt_stack(
    model: TinyLlama,
    sizes: list[int],
    context: int,
    backend: str | None,
    kv_cache_dtype: str = "auto",
    deterministic: bool = False,
) -> tuple[ModelStack, Any]:
    """The normal runtime stack for ``model`` with one DECODE graph per measured batch size
    (its KV cache of ``kv_cache_dtype``, :func:`~graphrt.engine.stack.stack_for`);
    ``deterministic``: batch-invariant kernels (``RuntimeConfig.deterministic``)."""
    config = RuntimeConfig(
        max_batch_size=max(sizes),
        max_context_len=capacity(context),
        page_size=PAGE_SIZE,
        buckets=tuple(sorted(set(sizes))),
        backend=backend,
        # NOTE: nodes and programmatic edges come from the graph's topology; the debug dump
        # (kernel recording: a profiled replay per graph) only where cuda.bindings is missing
        record_kernels=cuda_bindings_missing() is not None,
        deterministic=deterministic,
    )
    stack = stack_for(model, config, kv_cache_dtype=kv_cache_dtype)
    return stack, stack.runtime.capture()


def graphrt_prefill(stack: ModelStack, prompts: np.ndarray) -> None:
    """Prefill request row ``r`` with ``prompts[r]`` (one EXTEND per request: a step's logits
    are ``[tokens, vocab]`` fp32, 64 rows of 512 tokens at once would be 16 GB)."""
    pages = stack.runtime.config.max_pages
    context = prompts.shape[1]
    for req, prompt in enumerate(prompts):
        stack.runtime.run(
            Batch.create(
                ForwardMode.EXTEND,
                input_ids=prompt,
                seq_lens=[context],
                req_pool_indices=[req],
                out_cache_loc=slots(req, pages, 0, context),
                q_lens=[context],
            )
        )


def graphrt_decode(stack: ModelStack, next_ids: np.ndarray, context: int) -> Batch:
    """DECODE of rows ``0..bs-1``: token ``next_ids[r]`` at position ``context``."""
    pages = stack.runtime.config.max_pages
    bs = len(next_ids)
    return Batch.create(
        ForwardMode.DECODE,
        input_ids=next_ids,
        seq_lens=[context + 1] * bs,
        req_pool_indices=list(range(bs)),
        out_cache_loc=np.concatenate([slots(r, pages, context, context + 1) for r in range(bs)]),
    )


# ---- transformers --------------------------------------------------------------------------
@dataclass
class HFStep:
    """One decode step of a transformers model at position ``context`` over a static cache."""

    forward: Callable[..., Any]
    cache: Any
    ids: torch.Tensor
    positions: torch.Tensor
    context: int

    def rewind(self) -> None:
        """Point every layer's write position back at ``context`` (the step writes that slot)."""
        for layer in self.cache.layers:
            layer.cumulative_length.fill_(self.context)

    def __call__(self) -> torch.Tensor:
        cache = {cache_kwarg(self.forward): self.cache}
        out = self.forward(input_ids=self.ids, position_ids=self.positions, use_cache=True, **cache)
        return out.logits

    def logits(self) -> torch.Tensor:
        """``[bs, vocab]`` of one rewound step, copied (compiled outputs live in a graph pool)."""
        self.rewind()
        return self()[:, -1].float().clone()


@torch.no_grad()
def hf_prefill(hf: Any, prompts: torch.Tensor, max_len: int) -> Any:
    """A ``StaticCache`` of ``max_len`` positions holding ``prompts [bs, context]``."""
    from transformers import StaticCache

    cache = StaticCache(config=hf.config, max_cache_len=max_len)
    bs, context = prompts.shape
    positions = torch.arange(context, device=prompts.device).expand(bs, -1)
    hf(
        input_ids=prompts,
        position_ids=positions,
        use_cache=True,
        logits_to_keep=1,
        **{cache_kwarg(hf): cache},
    )
    return cache


def cache_kwarg(forward: Any) -> str:
    """The KV-cache argument of a transformers forward: ``cache`` from 5.24 on (which warns
    about ``past_key_values``), ``past_key_values`` before."""
    fn = getattr(forward, "forward", forward)
    fn = getattr(fn, "__wrapped__", fn)  # NOTE: torch.compile keeps the original here
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return "past_key_values"
    return "cache" if "cache" in params else "past_key_values"


def hf_step(forward: Callable[..., Any], cache: Any, next_ids: torch.Tensor, context: int) -> HFStep:
    """The decode step of ``next_ids [bs]`` at position ``context`` through ``forward``."""
    bs = next_ids.shape[0]
    positions = torch.full((bs, 1), context, dtype=torch.long, device=next_ids.device)
    return HFStep(forward, cache, next_ids[:, None].contiguous(), positions, context)


def compiled_forward(hf: Any) -> Callable[..., Any]:
    """``hf.forward`` under ``torch.compile(mode="reduce-overhead", dynamic=False)``: Inductor
    kernels replayed as CUDA graphs (one specialisation per batch size)."""
    return torch.compile(hf.forward, mode="reduce-overhead", dynamic=False)


def time_first_call(step: HFStep, device: torch.device) -> float:
    """Seconds of the first call (tracing and compiling, for a compiled forward)."""
    start = time.perf_counter()
    step.logits()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - start


def cudagraph_skips() -> int | None:
    """Compiled graphs Inductor ran *without* CUDA graphs so far (a reduce-overhead model that
    is not being replayed: its time would not be what reduce-overhead promises), or None when
    this torch does not count them."""
    try:
        from torch._dynamo.utils import counters
    except ImportError:
        return None
    return int(counters["inductor"]["cudagraph_skips"])


def compile_skip_reason(args: argparse.Namespace, device: torch.device) -> str | None:
    """Why the compiled transformers model is not measured at all, or None."""
    if args.no_compile:
        return "--no-compile"
    if device.type != "cuda":
        return "reduce-overhead replays CUDA graphs: CUDA only"
    return None


class CompileBudget:
    """Compile batch sizes while the seconds spent plus the last compile fit ``budget_s``
    (compiling an 8B model takes minutes per batch size)."""

    def __init__(self, budget_s: float) -> None:
        self.budget_s, self.spent_s, self.last_s = budget_s, 0.0, 0.0

    def allows(self) -> bool:
        return self.spent_s + self.last_s <= self.budget_s

    def add(self, seconds: float) -> None:
        self.spent_s += seconds
        self.last_s = seconds


def deterministic_stack(
    model: TinyLlama, sizes: list[int], context: int, backend: str | None, prompts: torch.Tensor
) -> ModelStack:
    """``--deterministic``: a second stack of ``model`` with batch-invariant kernels, prefilled
    with the same ``prompts [bs, context]`` as the default one."""
    stack = graphrt_stack(model, sizes, context, backend, deterministic=True)[0]
    graphrt_prefill(stack, prompts.numpy())
    return stack


def deterministic_row(
    stack: ModelStack, next_ids: np.ndarray, context: int, iters: int, ours: torch.Tensor
) -> dict[str, Any]:
    """The batch-invariant stack's step (``--deterministic``) at ``len(next_ids)`` rows: its time,
    and how far its logits are from the default stack's ``ours`` (the same weights and KV)."""
    batch = graphrt_decode(stack, next_ids, context)
    theirs = stack.runtime.run(batch).float()
    device = theirs.device
    return {
        "deterministic_us": percentiles(time_us(lambda: stack.runtime.run(batch), iters, device)),
        "deterministic_max_abs_logit_diff": float((theirs - ours).abs().max()),
    }
