"""A paged attention case on shuffled pages and a dense float64 oracle, shared by the backend,
sliding-window and chunked-local tests."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from graphrt import Batch, ForwardMode
from graphrt.buffers import Dims
from graphrt.kv import ReqToToken
from graphrt.metadata import StepBuffers, StepMetadata, derive
from graphrt.metadata.buffer_groups import BufferGroups, Dummies
from graphrt.metadata.groups import Geometry

HEADS, KV_HEADS, HEAD_DIM = 8, 2, 64


@dataclass
class PagedCase:
    q: torch.Tensor
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    buffers: StepBuffers
    meta: StepMetadata
    req_to_token: ReqToToken
    slots: list[np.ndarray]  # KV slot of every position of each request
    seq_lens: list[int]
    q_lens: list[int]
    dummy_page: int


def paged_case(
    device: torch.device, page_size: int, context: int, seq_lens: list[int], q_lens: list[int]
) -> PagedCase:
    """Random K/V on shuffled pages (a page-table bug cannot hide behind identity maps)."""
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    rng = np.random.default_rng(page_size * 7 + len(seq_lens))
    max_pages = -(-context // page_size)
    num_pages = len(seq_lens) * max_pages + 1
    gen = torch.Generator().manual_seed(1)
    shape = (num_pages, page_size, KV_HEADS, HEAD_DIM)
    k_cache = torch.randn(shape, generator=gen).to(device, dtype)
    v_cache = torch.randn(shape, generator=gen).to(device, dtype)
    perm = rng.permutation(num_pages - 1)
    slots = [
        perm[i * max_pages : (i + 1) * max_pages][np.arange(n) // page_size] * page_size
        + np.arange(n) % page_size
        for i, n in enumerate(seq_lens)
    ]
    dummy_slot = (num_pages - 1) * page_size
    r2t = ReqToToken(len(seq_lens), context, page_size, dummy_slot, device)
    for i, s in enumerate(slots):
        r2t.table[i, : len(s)] = torch.as_tensor(s, dtype=torch.int32)
    mode = ForwardMode.DECODE if set(q_lens) == {1} else ForwardMode.EXTEND
    batch = Batch.create(
        mode,
        input_ids=np.zeros(sum(q_lens), dtype=np.int64),
        seq_lens=seq_lens,
        req_pool_indices=list(range(len(seq_lens))),
        out_cache_loc=np.concatenate([s[n - q : n] for s, n, q in zip(slots, seq_lens, q_lens, strict=True)]),
        q_lens=q_lens,
    )
    dummies = Dummies(dummy_slot, dummy_slot // page_size, len(seq_lens))
    groups = BufferGroups(Dims(1, 1, max_pages, context), device, Geometry(page_size=page_size), dummies)
    buffers = groups.exact(batch, batch.bs).step
    derive(buffers, r2t, page_size)
    meta = StepMetadata(mode, buffers, max_seqlen_q=max(q_lens), page_size=page_size)
    q = torch.randn(sum(q_lens), HEADS, HEAD_DIM, generator=gen).to(device, dtype)
    return PagedCase(q, k_cache, v_cache, buffers, meta, r2t, slots, seq_lens, q_lens, num_pages - 1)


def oracle(
    case: PagedCase, first_key: Callable[[int], int], sinks: torch.Tensor | None = None
) -> torch.Tensor:
    """Dense float64 attention token by token: position ``p`` sees keys ``first_key(p) … p``;
    ``sinks [HEADS]`` join each head's denominator (``exp(sink)``, no value)."""
    flat = (-1, KV_HEADS, HEAD_DIM)
    k_flat, v_flat = case.k_cache.view(flat).cpu().double(), case.v_cache.view(flat).cpu().double()
    q, group, outs, t = case.q.cpu().double(), HEADS // KV_HEADS, [], 0
    for slots, n, q_len in zip(case.slots, case.seq_lens, case.q_lens, strict=True):
        for p in range(n - q_len, n):
            keys = slots[first_key(p) : p + 1]
            k = k_flat[keys].repeat_interleave(group, 1)
            v = v_flat[keys].repeat_interleave(group, 1)
            s = torch.einsum("hd,khd->hk", q[t], k) * HEAD_DIM**-0.5
            if sinks is not None:  # NOTE: a column of the sink logit, whose value is 0
                s = torch.cat((s, sinks.cpu().double()[:, None]), dim=1)
                v = torch.cat((v, v.new_zeros(1, *v.shape[1:])))
            outs.append(torch.einsum("hk,khd->hd", s.softmax(-1), v))
            t += 1
    return torch.stack(outs)


def tolerance(device: torch.device) -> float:
    """fp32 reference vs the float64 oracle: 1e-5; bf16 inputs (FA3 or reference): 2e-2."""
    return 2e-2 if device.type == "cuda" else 1e-5


def parity_step(setup, batch: Batch, device: torch.device) -> float:
    """Eager, then the graph, on ``batch``; assert they agree and the graph replayed."""
    runtime = setup.runtime
    replays = sum(runtime.dispatcher.replays.values())
    out_eager = runtime.run(batch, eager=True)
    out_graph = runtime.run(batch)
    assert sum(runtime.dispatcher.replays.values()) == replays + 1, "the step did not replay a graph"
    assert out_graph.shape == out_eager.shape and torch.isfinite(out_graph).all()
    # NOTE: on CUDA a lone row runs eagerly through the fused single-row prologue GEMMs and its
    # padded bucket through the unfused ops: bf16 rounding apart (seen: 0.025 on one logit).
    tol = {"atol": 3e-2, "rtol": 3e-2} if device.type == "cuda" else {"atol": 1e-4, "rtol": 0.0}
    where = f"{batch.mode.name} seq_lens={batch.seq_lens.tolist()} q_lens={batch.q_lens.tolist()}"
    torch.testing.assert_close(out_graph, out_eager, **tol, msg=lambda m: f"{where}: {m}")
    return (out_graph.float() - out_eager.float()).abs().max().item()
