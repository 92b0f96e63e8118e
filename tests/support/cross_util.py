"""The ``tiny-cross`` oracle: a plain, unpaged forward of one request, and a runtime driver.

:class:`PlainContext` is what a model's ``ctx`` would be with no KV cache at all: a forward over a
request's whole token sequence, dense causal self-attention over the tokens' own K/V and dense
cross-attention over the encoder K/V computed straight from the encoder. No page table, slot,
static buffer or graph is involved, so agreement with the runtime checks all of them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from graphrt import Batch, ForwardMode, RuntimeConfig
from graphrt.attention.context import ModelInputs
from graphrt.engine.stack import ModelStack, build_stack
from graphrt.kv.rope_store import rotate_ref


def dense(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
    """``q [T, hq, d]`` over ``k``/``v [L, kvh, d]`` in float64 (GQA by repeating K/V)."""
    group = q.shape[1] // k.shape[1]
    k, v = (t.double().repeat_interleave(group, dim=1) for t in (k, v))
    scores = torch.einsum("thd,lhd->htl", q.double(), k) * q.shape[-1] ** -0.5
    if causal:
        mask = torch.ones(q.shape[0], k.shape[0], dtype=torch.bool).tril(k.shape[0] - q.shape[0])
        scores = scores.masked_fill(~mask.to(q.device), float("-inf"))
    return torch.einsum("htl,lhd->thd", scores.softmax(-1), v).to(q.dtype)


class PlainContext(ModelInputs):
    """``ctx`` of an unpaged forward over one request's whole sequence (positions 0..T-1)."""

    def __init__(self, encoder_kv: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        self.encoder_kv = encoder_kv

    def attention(
        self, layer_id: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **options: Any
    ) -> torch.Tensor:
        """Dense causal attention (``ForwardContext.attention``'s arguments); ``options``: its
        keywords, of which only ``rope`` may be set (tiny-cross has no window, chunk or sinks)."""
        rope = options.pop("rope", None)
        assert all(o is None for o in options.values()), f"the plain forward attends fully: {options}"
        if rope is not None:
            q, k = rotate_ref(q, rope), rotate_ref(k, rope)
        return dense(q, k, v, causal=True)

    def cross_attention(self, layer_id: int, q: torch.Tensor) -> torch.Tensor:
        k, v = self.encoder_kv[layer_id]
        return dense(q, k, v, causal=False)


@torch.no_grad()
def plain_logits(model: torch.nn.Module, encoder_ids: Sequence[int], tokens: Sequence[int]) -> torch.Tensor:
    """``[len(tokens), vocab]`` float32 logits of the unpaged forward."""
    device = model.norm.weight.device
    ids = torch.tensor(tokens, dtype=torch.int64, device=device)
    ctx = PlainContext(model.encoder_kv(encoder_ids))
    return model(ids, torch.arange(len(tokens), device=device), ctx)


def cross_stack(device: torch.device, *, backend: str | None = None, **config: object) -> ModelStack:
    """``tiny-cross`` on ``device``: 6 request rows, buckets 1 and 4, page size 4.

    NOTE: no warm-up on the CPU (emulated graphs need none; it took 3 of a test's 4 s).
    """
    base = {"max_batch_size": 4, "max_context_len": 32, "page_size": 4, "buckets": (1, 4)}
    base["warmup"] = 0 if device.type == "cpu" else 2
    cfg = RuntimeConfig(backend=backend, **(base | config))  # type: ignore[arg-type]
    return build_stack("tiny-cross", device, cfg, max_reqs=6, seed=3)


@dataclass
class Seqs:
    """Requests driven through a runtime: their rows, token sequences and each step's logits."""

    stack: ModelStack
    rows: list[int]
    tokens: list[list[int]]
    logits: list[list[torch.Tensor]] = field(default_factory=list)

    def slots(self, i: int, positions: Sequence[int]) -> list[int]:
        """Row ``rows[i]``'s KV slots: its pages in reverse order (not an identity map)."""
        ps, pages = self.stack.kv.page_size, self.stack.runtime.config.max_pages
        row = self.rows[i]
        return [(row * pages + pages - 1 - p // ps) * ps + p % ps for p in positions]

    def prefill(self, eager: bool = False) -> None:
        n = [len(t) for t in self.tokens]
        batch = Batch.create(
            ForwardMode.EXTEND,
            input_ids=np.concatenate(self.tokens),
            seq_lens=n,
            req_pool_indices=self.rows,
            out_cache_loc=np.concatenate([self.slots(i, range(k)) for i, k in enumerate(n)]),
            q_lens=n,
        )
        out = self.stack.runtime.run(batch, eager=eager)
        ends = np.cumsum(n)
        self.logits = [[out[e - k + j] for j in range(k)] for e, k in zip(ends, n, strict=True)]

    def decode(self, eager: bool = False) -> torch.Tensor:
        """One greedy DECODE step of every request; returns its logits ``[bs, vocab]``."""
        nxt = [int(lg[-1].argmax()) for lg in self.logits]
        for t, tok in zip(self.tokens, nxt, strict=True):
            t.append(tok)
        n = [len(t) for t in self.tokens]
        batch = Batch.create(
            ForwardMode.DECODE,
            input_ids=nxt,
            seq_lens=n,
            req_pool_indices=self.rows,
            out_cache_loc=[self.slots(i, [k - 1])[0] for i, k in enumerate(n)],
        )
        out = self.stack.runtime.run(batch, eager=eager)
        for lg, row in zip(self.logits, out, strict=True):
            lg.append(row)
        return out
