"""The batch-invariant GEMM (``invariant.invariant_linear``, ``Engine(deterministic=True)``): row
``i`` of an ``M``-row product has the same bits as that row multiplied alone, for every ``M``,
and ``ops.linear`` takes it for every ``M`` inside a batch-invariant forward only.

Runs on the GPU (``-m gpu``) and on the CPU under Triton's interpreter (``TRITON_INTERPRET=1``,
rerun in a child process by the last test).
"""

from __future__ import annotations

import pytest
import torch
from torch.nn import functional as F

from graphrt.kernels import invariant
from graphrt.kernels import skinny as sk
from graphrt.kernels.switches import batch_invariant
from graphrt.models import ops
from tests.models.test_skinny import _assert_matches, _inputs
from tests.support.triton_util import rerun_marks, rerun_under_interpreter, triton_devices


@pytest.fixture
def kernel_on(monkeypatch: pytest.MonkeyPatch, device: torch.device) -> None:
    if device.type == "cpu":
        monkeypatch.setenv(sk.ENV, "interpret")


@pytest.mark.parametrize("device", triton_devices())
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize(("n", "k"), [(75, 200), (96, 1024)])
def test_each_row_has_the_same_bits_alone_and_in_any_batch(device, kernel_on, dtype, n, k) -> None:
    x, w, b = _inputs(device, dtype, 40, n, k, bias=True)
    whole = invariant.invariant_linear(x, w, b)
    _assert_matches(whole, x, w, b)
    for m in (1, 2, 16, 17):  # NOTE: one, a part of, a whole and more than one block of rows
        part = invariant.invariant_linear(x[:m], w, b)
        assert torch.equal(part, whole[:m]), f"M={m} differs from M=40"
    for i in (0, 5, 15, 16, 39):
        assert torch.equal(invariant.invariant_linear(x[i : i + 1], w, b), whole[i : i + 1]), f"row {i} alone"


@pytest.mark.parametrize("device", triton_devices())
def test_ops_linear_takes_it_in_a_batch_invariant_forward_only(device, kernel_on, monkeypatch) -> None:
    calls: list[tuple[int, ...]] = []
    kernel = invariant.invariant_linear
    monkeypatch.setattr(
        invariant, "invariant_linear", lambda *a, **kw: calls.append(a[0].shape) or kernel(*a, **kw)
    )
    x, w, b = _inputs(device, torch.bfloat16, 70, 48, 64, bias=True)  # NOTE: 70 > skinny.MAX_M
    with batch_invariant(True):
        got = ops.linear(x.view(70, 1, 64), w, b)
        one = ops.linear(x[:1], w, b)
    assert calls == [(70, 64), (1, 64)] and got.shape == (70, 1, 48)
    assert torch.equal(got.view(70, 48)[:1], one)
    assert torch.equal(ops.linear(x, w, b), F.linear(x, w, b)) and len(calls) == 2  # NOTE: default off


def test_refuses_what_it_cannot_compute_naming_it() -> None:
    x, w = torch.zeros(3, 8), torch.zeros(4, 8)
    with pytest.raises(ValueError, match="batch-invariant GEMM: dtypes"):
        invariant.invariant_linear(x, w)
    with pytest.raises(ValueError, match="batch-invariant GEMM: x has 0 rows"):
        invariant.invariant_linear(x[:0].bfloat16(), w.bfloat16())


@rerun_marks
def test_kernel_under_triton_interpreter() -> None:
    """On a CPU box: this file's kernel cases again, through Triton's interpreter."""
    rerun_under_interpreter(__file__, passed=7)
