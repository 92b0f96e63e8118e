"""The split decode kernel's backend entry, ``attend``: the step's split count and PDL switch
from its metadata, then the kernel (``decode_attention``).

Runs on the GPU (``-m gpu``) and on the CPU under ``TRITON_INTERPRET=1`` (a CPU box with Triton
reruns this file so, last test). A name clash once made ``attend`` call the launcher with the
wrong arguments; only model-level GPU tests saw it.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from graphrt.attention.split_decode import attend as dk
from tests.attention.test_decode_kernel import oracle
from tests.support.triton_util import rerun_marks, rerun_under_interpreter, triton_devices

ATOL = 2e-2


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


@pytest.mark.parametrize("device", triton_devices())
def test_attend_runs_the_kernel_with_the_steps_split_count(device) -> None:
    q, k, v, table, seqlens = case(device, [3, 0, 40], 9, 3, 64, 16)
    meta = SimpleNamespace(buffers=SimpleNamespace(page_table=table, cache_seqlens=seqlens), page_size=16)
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
    meta = SimpleNamespace(buffers=SimpleNamespace(page_table=table, cache_seqlens=seqlens), page_size=16)
    out = dk.attend(q, k, v, meta, 0.125, window, sinks)  # type: ignore[arg-type]
    want = oracle(q, k, v, table, seqlens, 0.125, window, sinks)
    torch.testing.assert_close(out.double().cpu(), want, atol=ATOL, rtol=ATOL)
    assert out[1].abs().max() == 0


@rerun_marks
def test_kernel_under_triton_interpreter() -> None:
    """On a CPU box: this file again, with the kernels run by Triton's interpreter."""
    rerun_under_interpreter(__file__, passed=4)
