"""The split decode kernel's backend entry, ``attend``: the step's split count and PDL switch
from its metadata, then the kernel (``decode_attention``).

Runs on the GPU (``-m gpu``) and on the CPU under ``TRITON_INTERPRET=1`` (a CPU box with Triton
reruns this file so, last test). A name clash once made ``attend`` call the launcher with the
wrong arguments; only model-level GPU tests saw it. A chunked-local layer's virtual batch (a row
per query token, siblings of one request among them) runs through it too.
"""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest
import torch

from graphrt.attention.split_decode import attend as dk
from graphrt.step.modes import ForwardMode
from tests.attention.test_decode_kernel import oracle
from tests.attention.test_local_attention import local_for
from tests.support import paged_util
from tests.support.triton_util import rerun_marks, rerun_under_interpreter, triton_devices

ATOL = 2e-2
#: A chunked-local case: chunk 128 (two key blocks, so splits can share a row's chunk) over a
#: 3-chunk context; lengths before, on and past the edges 128 and 256, chains straddling them.
CHUNK, LOCAL_CONTEXT = 128, 384
LOCAL_LENS = [127, 128, 129, 130, 256, 257, 384]
LOCAL_Q_LENS = [1, 4, 2, 3, 4, 2, 4]
#: A verify chain's query rows a request (the root and 3 drafts).
CHAIN_Q = 4


def case(device: torch.device, lens: list[int], heads: int, heads_k: int, d: int, page: int):
    """Random q and caches in bf16; request ``i``'s pages shuffled, page 0 unused."""
    gen = torch.Generator().manual_seed(7)
    b, max_pages = len(lens), -(-max(lens) // page)
    table = (torch.randperm(b * max_pages, generator=gen) + 1).view(b, max_pages).to(torch.int32)
    cache = (b * max_pages + 1, page, heads_k, d)
    k, v = torch.randn(cache, generator=gen), torch.randn(cache, generator=gen)
    q = torch.randn(b, heads, d, generator=gen)
    q, k, v = (t.to(device, torch.bfloat16) for t in (q, k, v))
    return q, k, v, table.to(device), torch.tensor(lens, dtype=torch.int32, device=device)


def step_meta(table, seqlens, mode=ForwardMode.DECODE, q_len: int = 1) -> SimpleNamespace:
    """What ``attend`` reads of a step's metadata (no token tree)."""
    buffers = SimpleNamespace(page_table=table, cache_seqlens=seqlens)
    return SimpleNamespace(buffers=buffers, page_size=16, mode=mode, cascade=None, max_seqlen_q=q_len)


@pytest.mark.parametrize("device", triton_devices())
def test_attend_runs_the_kernel_with_the_steps_split_count(device) -> None:
    q, k, v, table, seqlens = case(device, [3, 0, 40], 9, 3, 64, 16)
    meta = step_meta(table, seqlens)
    splits = dk.num_splits(3, 3, table.shape[1] * 16, dk.sms(device))
    out = dk.attend(q, k, v, meta, 0.125)  # type: ignore[arg-type]
    pdl = dk.pdl_enabled(dk.PDL_ENV, device)
    assert torch.equal(out, dk.decode_attention(q, k, v, table, seqlens, 0.125, splits, pdl))
    torch.testing.assert_close(
        out.double().cpu(), oracle(q, k, v, table, seqlens, 0.125), atol=ATOL, rtol=ATOL
    )


@pytest.mark.parametrize("device", triton_devices())
@pytest.mark.parametrize("window", [None, 0, 20])
def test_attend_takes_a_sliding_window_and_sinks(device, window) -> None:
    """gpt-oss's decode layers through the kernel: the last ``window + 1`` keys (or all), a sink
    logit per query head in the denominator; a row without keys stays zero."""
    q, k, v, table, seqlens = case(device, [3, 0, 40, 21], 8, 2, 64, 16)
    sinks = torch.randn(8, generator=torch.Generator().manual_seed(1)).to(device, torch.bfloat16)
    meta = step_meta(table, seqlens)
    out = dk.attend(q, k, v, meta, 0.125, window, sinks)  # type: ignore[arg-type]
    want = oracle(q, k, v, table, seqlens, 0.125, window, sinks)
    torch.testing.assert_close(out.double().cpu(), want, atol=ATOL, rtol=ATOL)
    assert out[1].abs().max() == 0


@pytest.mark.parametrize("device", triton_devices())
@pytest.mark.parametrize("page_size", [1, 16])
def test_attend_takes_a_chunked_local_virtual_batch(device, page_size: int, monkeypatch) -> None:
    """A chunked-local layer's virtual batch (one row per query token: a request's chain of
    tokens are sibling rows, each seeing its own chunk up to itself) through ``attend`` with the
    step's plan, and through the launch at 1, 2 and 3 splits (a chunk's two key blocks shared or
    not): within bf16 rounding (:data:`ATOL`) of dense chunk-masked float64 attention."""
    pc = paged_util.paged_case(device, page_size, LOCAL_CONTEXT, LOCAL_LENS, LOCAL_Q_LENS)
    step = local_for(pc, page_size, CHUNK, LOCAL_CONTEXT)
    pc = dataclasses.replace(pc, **{n: getattr(pc, n).bfloat16() for n in ("q", "k_cache", "v_cache")})
    q, k, v, b = pc.q, pc.k_cache, pc.v_cache, step.meta.buffers
    monkeypatch.setattr(dk, "enabled", lambda device: True)  # NOTE: the CPU's switch aside
    assert dk.takes(q, k, step.meta), "the backend would not take the virtual batch"
    scale = paged_util.HEAD_DIM**-0.5
    want = paged_util.oracle(pc, lambda p: p - p % CHUNK)
    assert not torch.allclose(want, paged_util.oracle(pc, lambda p: 0)), "no token past a chunk edge"
    outs = [dk.attend(q, k, v, step.meta, scale)]  # type: ignore[arg-type]
    outs += [dk.decode_attention(q, k, v, b.page_table, b.cache_seqlens, scale, s, False) for s in (1, 2, 3)]
    for splits, out in zip(("plan", 1, 2, 3), outs, strict=True):
        torch.testing.assert_close(
            out.double().cpu(), want, atol=ATOL, rtol=ATOL, msg=lambda m, s=splits: f"splits {s}: {m}"
        )


@pytest.mark.parametrize("device", triton_devices())
@pytest.mark.parametrize("window", [None, 20])
def test_attend_takes_a_verify_chain(device, window, monkeypatch) -> None:
    """A TARGET_VERIFY chain (:data:`CHAIN_Q` query rows a request, the last at its newest key)
    through ``attend`` and through the launch at 1, 2 and 3 splits: row ``i`` of request ``b``
    sees the keys up to position ``seqlen_b - CHAIN_Q + i``, within bf16 rounding of the float64
    oracle over those keys; a chain's rows read each other's new keys, so the store is never
    fused; a token tree (a cascade) or a ragged step is not taken."""
    lens = [4, 40, 21, 70, 64]
    _, k, v, table, seqlens = case(device, lens, 8, 2, 64, 16)
    q = torch.randn(len(lens) * CHAIN_Q, 8, 64, generator=torch.Generator().manual_seed(3)).to(
        device, torch.bfloat16
    )
    meta = step_meta(table, seqlens, ForwardMode.TARGET_VERIFY, CHAIN_Q)
    monkeypatch.setattr(dk, "enabled", lambda device: True)  # NOTE: the CPU's switch aside
    assert dk.chain_of(q, meta) == CHAIN_Q and dk.takes(q, k, meta, window)  # type: ignore[arg-type]
    rows = torch.arange(len(lens) * CHAIN_Q)
    own = seqlens.cpu().repeat_interleave(CHAIN_Q) - (CHAIN_Q - 1 - rows % CHAIN_Q)
    want = oracle(q, k, v, table.repeat_interleave(CHAIN_Q, 0), own, 0.125, window)
    outs = [dk.attend(q, k, v, meta, 0.125, window)]  # type: ignore[arg-type]
    outs += [
        dk.decode_attention(q, k, v, table, seqlens, 0.125, s, False, window, chain=CHAIN_Q)
        for s in (1, 2, 3)
    ]
    for splits, out in zip(("plan", 1, 2, 3), outs, strict=True):
        torch.testing.assert_close(
            out.double().cpu(), want, atol=ATOL, rtol=ATOL, msg=lambda m, s=splits: f"splits {s}: {m}"
        )
    fresh = SimpleNamespace(k=q[:, :2], v=q[:, :2], cos_sin=q[:, 0], loc=rows.to(device))
    assert not dk.fuses_store(q, k, v, fresh, meta)  # type: ignore[arg-type]
    for other in ({"cascade": object()}, {"mode": ForwardMode.DRAFT_EXTEND}):
        assert not dk.takes(q, k, SimpleNamespace(**{**vars(meta), **other}))  # type: ignore[arg-type]


@rerun_marks
def test_kernel_under_triton_interpreter() -> None:
    """On a CPU box: this file again, with the kernels run by Triton's interpreter."""
    rerun_under_interpreter(__file__, passed=8)
