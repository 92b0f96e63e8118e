"""The split decode kernel's merge by the last split program (one launch, the default) against the
merge launch (``GRAPHRT_DECODE_MERGE_LAST=0``) and the float64 oracle.

Runs on the GPU (``-m gpu``) and on the CPU under ``TRITON_INTERPRET=1`` (small shapes; a CPU box
with Triton reruns this file so, last test). Checked: both paths within the kernel's tolerance of
the oracle at several split counts, a row without keys gets zeros, the arrival counters read 0
after every launch (so the next launch, eager or a replay, starts from 0), and repeated launches
on the shared counters give the same bits.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from graphrt.attention import decode_kernel as dk
from graphrt.step import scratch
from tests.attention.test_decode_kernel import oracle
from tests.triton_util import rerun_marks, rerun_under_interpreter, triton_devices

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
@pytest.mark.parametrize(("heads", "heads_k", "d"), [(9, 3, 64), (32, 8, 64), (32, 8, 128)])
def test_the_last_split_merges_as_the_merge_launch(device, heads, heads_k, d, monkeypatch) -> None:
    if device.type == "cpu" and heads > 9:
        pytest.skip("the interpreter runs the small shape")
    lens = [1, 0, 65, 130] if device.type == "cpu" else [1, 0, 16, 65, 129, 300]
    q, k, v, table, seqlens = case(device, lens, heads, heads_k, d, 16)
    scale = d**-0.5
    expected = oracle(q, k, v, table, seqlens, scale)
    for splits in (1, 3) if device.type == "cpu" else (1, 2, 3, 7, 33):
        monkeypatch.setenv(dk.MERGE_ENV, "0")
        two = dk.decode_attention(q, k, v, table, seqlens, scale, splits, False)
        monkeypatch.setenv(dk.MERGE_ENV, "1")
        one = dk.decode_attention(q, k, v, table, seqlens, scale, splits, False)
        assert not scratch.counters(len(lens) * heads_k, device).any(), "launches leave the counters at 0"
        again = dk.decode_attention(q, k, v, table, seqlens, scale, splits, False)
        assert torch.equal(one, again), f"{splits} splits: a second launch on the shared counters differs"
        assert one[1].abs().max() == 0, "the row without keys gets zeros"
        for out, name in ((one, "last split"), (two, "merge launch")):
            torch.testing.assert_close(
                out.double().cpu(),
                expected,
                atol=ATOL,
                rtol=ATOL,
                msg=lambda m, n=name, s=splits: f"{n} {s}: {m}",
            )


@pytest.mark.parametrize("device", triton_devices())
def test_attend_runs_the_kernel_with_the_steps_split_count(device, monkeypatch) -> None:
    """The backend's entry (``attend``: split count and PDL from the step) launches the kernel."""
    q, k, v, table, seqlens = case(device, [3, 40], 9, 3, 64, 16)
    if device.type == "cpu":
        monkeypatch.setattr(dk, "sm_count", lambda _: 132)
    meta = SimpleNamespace(buffers=SimpleNamespace(page_table=table, cache_seqlens=seqlens), page_size=16)
    splits = dk.num_splits(2, 3, table.shape[1] * 16, dk.sm_count(device))
    out = dk.attend(q, k, v, meta, 0.125)  # type: ignore[arg-type]
    assert torch.equal(
        out, dk.decode_attention(q, k, v, table, seqlens, 0.125, splits, device.type == "cuda")
    )


def test_counters_are_shared_per_stream_and_sized_in_powers_of_two() -> None:
    cpu = torch.device("cpu")
    a, b = scratch.counters(5, cpu), scratch.counters(8, cpu)
    assert a is b and a.shape == (8,) and a.dtype == torch.int32 and not a.any()
    assert scratch.counters(9, cpu).shape == (16,)


@rerun_marks
def test_kernel_under_triton_interpreter() -> None:
    """On a CPU box: this file again, with the kernels run by Triton's interpreter."""
    rerun_under_interpreter(__file__, passed=3)
