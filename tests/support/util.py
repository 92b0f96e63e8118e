"""Builders shared by the runtime tests: a small runtime, random decode batches."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from graphrt import Batch, ForwardMode, GraphRuntime, PagedKVCache, ReqToToken, RuntimeConfig
from graphrt.attention import available_backends, registry
from graphrt.engine.stack import build_stack
from graphrt.models import TinyLlama
from graphrt.parallel import StepChannel, TPGroup
from graphrt.runtime import TPRuntime
from graphrt.step.modes import SpecGeometry


def backends(device: torch.device) -> list[str]:
    """Every backend usable on ``device`` as composed (FA3 on a Hopper GPU with sgl_kernel, and
    reference): not the rows that are parts of a dispatch (the conformance suite has those)."""
    parts = registry.dispatch_parts("mha")
    return [name for name in available_backends(device) if name not in parts]


def dtype_for(device: torch.device) -> torch.dtype:
    return torch.bfloat16 if device.type == "cuda" else torch.float32


@dataclass
class Setup:
    runtime: GraphRuntime
    model: TinyLlama
    kv: PagedKVCache
    req_to_token: ReqToToken
    pages_per_req: int


def build_runtime(
    device: torch.device,
    *,
    backend: str | None = "reference",
    page_size: int = 16,
    max_batch_size: int = 8,
    max_context_len: int = 128,
    buckets: Sequence[int] | None = None,
    capture: bool = True,
    debug: bool = False,
    strict: bool = False,
    max_reqs: int | None = None,
    model: str = "tiny-llama",
    seed: int = 0,
    modes: Sequence[ForwardMode] = (ForwardMode.DECODE,),
    speculative: SpecGeometry | None = None,
    kv_cache_dtype: str | None = None,
    sample: bool = False,
    tp: TPGroup | None = None,
    window_pool: bool = False,
    dtype: torch.dtype | None = None,
    token_buckets: Sequence[int] = (),
    lazy: bool = False,
    token_masks: bool = False,
    penalties: bool = False,
    logprobs: int = 0,
) -> Setup:
    """A tiny-llama runtime whose request ``i`` owns pages ``i*pages_per_req ...`` (contiguous);
    ``lazy``: its graphs are captured on first use (``RuntimeConfig(capture="lazy")``);
    ``token_masks``, ``penalties``, ``logprobs``: the sampling step's options (with ``sample``)."""
    config = RuntimeConfig(
        max_batch_size=max_batch_size,
        max_context_len=max_context_len,
        page_size=page_size,
        buckets=tuple(buckets) if buckets else None,
        capture_modes=tuple(modes) if capture else (),
        speculative=speculative,
        backend=backend,
        debug=debug,
        strict=strict,
        warmup=1,
        sample=sample,
        token_buckets=tuple(token_buckets),
        capture="lazy" if lazy else "eager",
        token_masks=token_masks,
        penalties=penalties,
        logprobs=logprobs,
    )
    stack = build_stack(
        model,
        device,
        config,
        max_reqs=max_reqs,
        seed=seed,
        kv_cache_dtype=kv_cache_dtype,
        tp=tp or TPGroup(),
        window_pool=window_pool,
        dtype=dtype,
    )
    runtime = stack.runtime if tp is None else TPRuntime(stack.runtime, StepChannel(tp))
    if capture:
        runtime.capture()
    return Setup(runtime, stack.model, stack.kv, stack.req_to_token, config.max_pages)


def perturb_norms(model: torch.nn.Module, seed: int = 1) -> None:
    """Set every norm weight of ``model`` to ``1 + N(0, 0.1)`` (seeded), so a kernel that skips
    or misplaces a norm's weight shows in the logits."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1 + 0.1 * torch.randn(p.shape, generator=gen))


def slot_of(setup: Setup, req: int, pos: int) -> int:
    """KV slot of position ``pos`` of request row ``req`` (contiguous pages per request)."""
    ps = setup.kv.page_size
    return (req * setup.pages_per_req + pos // ps) * ps + pos % ps


def prefill(setup: Setup, reqs: Sequence[int], lens: Sequence[int], rng: np.random.Generator) -> None:
    """Fill the KV of requests ``reqs`` up to ``lens`` tokens with one eager EXTEND."""
    vocab = setup.model.vocab_size
    batch = Batch.create(
        ForwardMode.EXTEND,
        input_ids=rng.integers(0, vocab, int(sum(lens))),
        seq_lens=list(lens),
        req_pool_indices=list(reqs),
        out_cache_loc=[slot_of(setup, r, p) for r, n in zip(reqs, lens, strict=True) for p in range(n)],
        q_lens=list(lens),
    )
    setup.runtime.run(batch)


def refill(setup: Setup, reqs: Sequence[int], length: int) -> None:
    """Prefill rows ``reqs`` again from position 0 to ``length``, so the next step may read any
    position below ``length`` whatever earlier steps on those rows dropped (KV isolation)."""
    prefill(setup, reqs, [length] * len(reqs), np.random.default_rng(length))


def next_lens(setup: Setup, reqs: Sequence[int]) -> list[int]:
    """The seq_len of each row's next DECODE step: one past what the row validly holds."""
    return [int(setup.req_to_token.valid_lens[r]) + 1 for r in reqs]


def decode_batch(
    setup: Setup, reqs: Sequence[int], seq_lens: Sequence[int], rng: np.random.Generator
) -> Batch:
    """A DECODE batch: request ``reqs[i]`` writes position ``seq_lens[i] - 1``."""
    return Batch.create(
        ForwardMode.DECODE,
        input_ids=rng.integers(0, setup.model.vocab_size, len(reqs)),
        seq_lens=list(seq_lens),
        req_pool_indices=list(reqs),
        out_cache_loc=[slot_of(setup, r, n - 1) for r, n in zip(reqs, seq_lens, strict=True)],
    )


def spec_batch(
    setup: Setup,
    mode: ForwardMode,
    reqs: Sequence[int],
    seq_lens: Sequence[int],
    q_lens: Sequence[int],
    rng: np.random.Generator,
) -> Batch:
    """A batch of ``mode`` whose request ``reqs[i]`` writes its last ``q_lens[i]`` positions."""
    return Batch.create(
        mode,
        input_ids=rng.integers(0, setup.model.vocab_size, int(sum(q_lens))),
        seq_lens=list(seq_lens),
        req_pool_indices=list(reqs),
        out_cache_loc=[
            slot_of(setup, r, p)
            for r, n, q in zip(reqs, seq_lens, q_lens, strict=True)
            for p in range(n - q, n)
        ],
        q_lens=list(q_lens),
    )


def remade(batch: Batch, **changes: object) -> Batch:
    """``batch`` rebuilt through ``Batch.create`` (so every check runs) with some fields changed."""
    fields = ("input_ids", "seq_lens", "req_pool_indices", "out_cache_loc", "q_lens", "tree_mask")
    kwargs = {f: getattr(batch, f) for f in fields} | changes
    return Batch.create(batch.mode, **kwargs)  # type: ignore[arg-type]
