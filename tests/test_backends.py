"""Attention backends against an independent oracle: a per-request dense loop over slots.

The reference backend is checked on every device; FA3 wherever it is available (H100 with
sgl_kernel). Both decode (uniform q_len 1) and EXTEND (ragged q_lens) metadata are used.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from graphrt import Batch, ForwardMode
from graphrt.attention import available_backends, select_backend
from graphrt.kv_cache import ReqToToken
from graphrt.metadata import StepMetadata, derive, fresh_buffers

HEADS, KV_HEADS, HEAD_DIM, CONTEXT = 8, 2, 64, 96


def naive(
    q: torch.Tensor,
    k_flat: torch.Tensor,
    v_flat: torch.Tensor,
    slots_per_req: list[np.ndarray],
    q_lens: list[int],
    scale: float,
) -> torch.Tensor:
    """Dense causal attention request by request, straight from the KV slots."""
    outs, start = [], 0
    group = HEADS // KV_HEADS
    for slots, n in zip(slots_per_req, q_lens, strict=True):
        qq = q[start : start + n].double()
        k = k_flat[slots].double().repeat_interleave(group, 1)
        v = v_flat[slots].double().repeat_interleave(group, 1)
        s = torch.einsum("qhd,khd->hqk", qq, k) * scale
        q_pos = torch.arange(n)[:, None] + len(slots) - n
        s = s.masked_fill(torch.arange(len(slots))[None, :] > q_pos, float("-inf"))
        outs.append(torch.einsum("hqk,khd->qhd", s.softmax(-1), v))
        start += n
    return torch.cat(outs)


def _case(
    device: torch.device, page_size: int, seq_lens: list[int], q_lens: list[int], dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, StepMetadata, torch.Tensor]:
    rng = np.random.default_rng(page_size * 7 + len(seq_lens))
    max_pages = -(-CONTEXT // page_size)
    num_pages = len(seq_lens) * max_pages + 1
    gen = torch.Generator().manual_seed(1)
    k_cache = torch.randn(num_pages, page_size, KV_HEADS, HEAD_DIM, generator=gen).to(device, dtype)
    v_cache = torch.randn(num_pages, page_size, KV_HEADS, HEAD_DIM, generator=gen).to(device, dtype)
    # NOTE: requests own shuffled pages, so a page-table bug cannot hide behind identity maps.
    perm = rng.permutation(num_pages - 1)
    pages = [perm[i * max_pages : (i + 1) * max_pages] for i in range(len(seq_lens))]
    slots = [
        np.asarray(p)[np.arange(n) // page_size] * page_size + np.arange(n) % page_size
        for p, n in zip(pages, seq_lens, strict=True)
    ]
    r2t = ReqToToken(len(seq_lens), CONTEXT, page_size, (num_pages - 1) * page_size, device)
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
    pad = {
        "dummy_slot": (num_pages - 1) * page_size,
        "dummy_req": len(seq_lens),
        "pad_q_len": 1,
        "pad_seq_len": 1,
    }
    buffers = fresh_buffers(batch, batch.bs, max_pages, pad, device)
    derive(buffers, r2t, page_size)
    meta = StepMetadata(mode, buffers, max_seqlen_q=max(q_lens), page_size=page_size)
    q = torch.randn(sum(q_lens), HEADS, HEAD_DIM, generator=gen).to(device, dtype)
    flat = (-1, KV_HEADS, HEAD_DIM)
    expected = naive(
        q.cpu(), k_cache.view(flat).cpu(), v_cache.view(flat).cpu(), slots, q_lens, HEAD_DIM**-0.5
    )
    return q, k_cache, v_cache, meta, expected


CASES = [
    ([1, 17, 16, 96, 33], [1, 1, 1, 1, 1]),  # decode, page edges, full context
    ([5, 40, 96], [5, 7, 30]),  # ragged extend with prefixes
]


@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize(("seq_lens", "q_lens"), CASES)
def test_backends_match_naive_oracle(
    device: torch.device, page_size: int, seq_lens: list[int], q_lens: list[int]
) -> None:
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    # fp32 reference vs float64 oracle: 1e-5; bf16 inputs through FA3 or the reference: 2e-2.
    atol = 2e-2 if dtype == torch.bfloat16 else 1e-5
    q, k_cache, v_cache, meta, expected = _case(device, page_size, seq_lens, q_lens, dtype)
    for name in available_backends(device):
        out = select_backend(name, device).forward(q, k_cache, v_cache, meta, HEAD_DIM**-0.5)
        assert out.shape == q.shape and out.dtype == q.dtype
        torch.testing.assert_close(
            out.double().cpu(), expected, atol=atol, rtol=atol, msg=lambda m, n=name: f"{n}: {m}"
        )


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA")
def test_fa3_is_selected_on_hopper_with_sgl_kernel() -> None:
    pytest.importorskip("sgl_kernel.flash_attn")
    assert available_backends(torch.device("cuda"))[0] == "fa3"
