"""Attention backends against an independent oracle: a per-request dense loop over slots.

The reference backend is checked on every device; FA3 wherever it is available (H100 with
sgl_kernel). Both decode (uniform q_len 1) and EXTEND (ragged q_lens) metadata are used.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from graphrt.attention import AttendCall, available_backends, select_backend
from tests.support.paged_util import HEAD_DIM, oracle, paged_case, tolerance
from tests.support.util import backends

CONTEXT = 96
CASES = [
    ([1, 17, 16, 96, 33], [1, 1, 1, 1, 1]),  # decode, page edges, full context
    ([5, 40, 96], [5, 7, 30]),  # ragged extend with prefixes
]


@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize(("seq_lens", "q_lens"), CASES)
def test_backends_match_naive_oracle(
    device: torch.device, page_size: int, seq_lens: list[int], q_lens: list[int]
) -> None:
    case = paged_case(device, page_size, CONTEXT, seq_lens, q_lens)
    expected, atol = oracle(case, lambda p: 0), tolerance(device)  # causal: every key up to p
    q, k_cache, v_cache, meta = case.q, case.k_cache, case.v_cache, case.meta
    for name in backends(device):
        out = select_backend(name, device).forward(AttendCall(q, k_cache, v_cache, meta, HEAD_DIM**-0.5))
        assert out.shape == q.shape and out.dtype == q.dtype
        torch.testing.assert_close(
            out.double().cpu(), expected, atol=atol, rtol=atol, msg=lambda m, n=name: f"{n}: {m}"
        )


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA")
def test_fa3_is_selected_on_hopper_with_sgl_kernel() -> None:
    pytest.importorskip("sgl_kernel.flash_attn")
    assert available_backends(torch.device("cuda"))[0] == "fa3"


def test_fa3_is_not_offered_for_fp32_kv() -> None:
    """FA3 refuses fp32 at launch: an fp32 cache selects the reference, and asking for FA3
    by name says why (device and dtype), before anything is built."""
    from graphrt.attention.fa3 import fa3_available

    cuda = torch.device("cuda")
    assert not fa3_available(cuda, torch.float32)
    assert "fa3" not in available_backends(cuda, dtype=torch.float32)
    # NOTE: split decode's row serves any cache (the reference where its kernel cannot)
    assert {"fa3", "fa3_kernel"}.isdisjoint(available_backends(cuda, dtype=torch.float32))
    with pytest.raises(ValueError, match=r"'fa3' is not available on cuda with a float32 KV cache"):
        select_backend("fa3", cuda, dtype=torch.float32)
    assert select_backend(None, cuda, dtype=torch.float32).name == "reference"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA")
@pytest.mark.parametrize("requests", [1, 64])
def test_fa3_planned_step_matches_the_oracle_split_or_not(requests: int) -> None:
    """The step's plan (``get_scheduler_metadata``) with the bucket's split count: FA3's heuristic
    at 1 request, unsplit at 64 (64 x 2 KV heads fill the GPU), the same as the oracle."""
    from graphrt.attention.fa3_plan import FA3Buffers, planned_splits, sm_count

    device = torch.device("cuda")
    if "fa3" not in available_backends(device):
        pytest.skip("FA3 is not available here")
    seq_lens = [1 + (37 * i) % CONTEXT for i in range(requests)]
    case = paged_case(device, 16, CONTEXT, seq_lens, [1] * requests)
    backend = select_backend("fa3_kernel", device)
    assert backend.splits_for(requests, 2, device) == planned_splits(requests, 2, sm_count(device))
    group = FA3Buffers(torch.zeros(4 * requests + 16, dtype=torch.int32, device=device))
    call = AttendCall(case.q, case.k_cache, case.v_cache, case.meta, HEAD_DIM**-0.5, group=group)
    plan = backend.plan(call)
    assert plan is not None
    out = backend.forward(dataclasses.replace(call, plan=plan))
    atol = tolerance(device)
    torch.testing.assert_close(out.double().cpu(), oracle(case, lambda p: 0), atol=atol, rtol=atol)
