"""Cross-attention kernels against a dense float64 oracle: every backend (the reference on the CPU,
FA3 and the reference on an H100), encoder K/V on shuffled pages, ragged queries.

Tolerances: float32 on the CPU (measured ~1e-6; 1e-4 allowed); bf16 on CUDA, 2e-2 as the other
bf16 backend tests (one bf16 rounding of an O(1) output is ~8e-3).
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from graphrt import ForwardMode
from graphrt.attention import AttendCall, select_backend
from graphrt.metadata.base import StepMetadata
from graphrt.metadata.encoder import EncoderBuffers
from tests.support.util import backends, dtype_for

KV_HEADS, HEADS, HEAD_DIM, PAGE = 2, 8, 64, 16
ENCODER_LENS = [1, 15, 17, 64]  # one token, both sides of a page edge, four full pages
MAX_PAGES = 4


def case(device: torch.device, q_lens: list[int], pad_rows: int) -> tuple:
    """Encoder K/V of each request on shuffled pages (garbage past each length), its page
    table and lengths plus ``pad_rows`` dummy rows, queries packed by ``q_lens``."""
    dtype, gen = dtype_for(device), torch.Generator().manual_seed(5)
    bs = len(ENCODER_LENS)
    num_pages = bs * MAX_PAGES + 1
    dummy = num_pages - 1
    shape = (num_pages, PAGE, KV_HEADS, HEAD_DIM)
    k_cache, v_cache = torch.randn(shape, generator=gen), torch.randn(shape, generator=gen)
    perm = np.random.default_rng(2).permutation(num_pages - 1)
    table = torch.full((bs + pad_rows, MAX_PAGES), dummy, dtype=torch.int32)
    keys = []
    for i, n in enumerate(ENCODER_LENS):
        pages = perm[i * MAX_PAGES : (i + 1) * MAX_PAGES]
        used = -(-n // PAGE)
        table[i, :used] = torch.as_tensor(pages[:used], dtype=torch.int32)
        slots = torch.as_tensor(pages[np.arange(n) // PAGE] * PAGE + np.arange(n) % PAGE)
        keys.append(slots)
        stale = torch.as_tensor(pages[used - 1] * PAGE + np.arange(n % PAGE or PAGE, PAGE))
        for cache in (k_cache, v_cache):
            cache.view(-1, KV_HEADS, HEAD_DIM)[stale] = 1e3  # NOTE: must never be read
    lens = torch.tensor(ENCODER_LENS + [1] * pad_rows, dtype=torch.int32)
    q_all = q_lens + [1] * pad_rows
    q = torch.randn(sum(q_all), HEADS, HEAD_DIM, generator=gen)
    cu = torch.tensor([0, *np.cumsum(q_all)], dtype=torch.int32)
    to = dict(device=device)
    enc = EncoderBuffers(table.to(**to), lens.to(**to))
    buffers = SimpleNamespace(cu_seqlens_q=cu.to(**to))
    mode = ForwardMode.DECODE if set(q_lens) == {1} else ForwardMode.EXTEND
    meta = StepMetadata(mode, buffers, max(q_all), PAGE)  # type: ignore[arg-type]
    k_cache, v_cache, q = (t.to(device, dtype) for t in (k_cache, v_cache, q))
    return q, k_cache, v_cache, meta, enc, keys, cu.tolist()


def oracle(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, keys: list, cu: list, bs: int
) -> torch.Tensor:
    """Each request's queries over all of its encoder keys, float64, no mask."""
    out = []
    for b in range(bs):
        k, v = (c.view(-1, KV_HEADS, HEAD_DIM)[keys[b].to(c.device)].double() for c in (k_cache, v_cache))
        k, v = (t.repeat_interleave(HEADS // KV_HEADS, dim=1) for t in (k, v))
        qb = q[cu[b] : cu[b + 1]].double()
        probs = (torch.einsum("thd,lhd->htl", qb, k) * HEAD_DIM**-0.5).softmax(-1)
        out.append(torch.einsum("htl,lhd->thd", probs, v))
    return torch.cat(out)


@pytest.mark.parametrize("q_lens", [[1, 1, 1, 1], [3, 1, 2, 4]], ids=["decode", "ragged"])
def test_cross_matches_dense_oracle(device: torch.device, q_lens: list[int]) -> None:
    q, k_cache, v_cache, meta, enc, keys, cu = case(device, q_lens, pad_rows=2)
    want = oracle(q, k_cache, v_cache, keys, cu, len(q_lens))
    tol = 2e-2 if device.type == "cuda" else 1e-4
    for name in backends(device):
        backend = select_backend(name, device, dtype=k_cache.dtype)
        out = backend.cross(AttendCall(q, k_cache, v_cache, meta, HEAD_DIM**-0.5), enc)
        assert out.shape == q.shape and out.dtype == q.dtype
        real = out[: cu[len(q_lens)]].double()
        torch.testing.assert_close(real, want, atol=tol, rtol=0, msg=f"{name} cross-attention")
        assert torch.isfinite(out).all()
