"""The MHA backends' options against a dense float64 oracle: an FP8 KV cache read with its
scales, attention sinks, both, with and without a sliding window.

The oracle reads the dequantised cache (``fp8 × scale``) and the query rounded to FP8, as the
kernels must; sinks join each head's denominator. The reference backend runs on every device;
FA3 wherever it is available (then also against the reference on the same inputs).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from graphrt.attention import AttendCall, available_backends, select_backend
from graphrt.attention.fa3 import check_sinks
from graphrt.kv.quant import FP8, LayerScales, dequantize, quantize
from tests.support.paged_util import HEAD_DIM, HEADS, PagedCase, oracle, paged_case

W, CONTEXT = 24, 96
SCALES = (0.02, 0.05)  # k, v: random N(0, 1) keys land in e4m3's normal range
CASES = [([1, 17, 16, 96, 33], [1] * 5), ([5, 40, 96], [5, 7, 30])]
OPTIONS = [(False, True), (True, False), (True, True)]  # (fp8, sinks)


def fp8_case(case: PagedCase) -> tuple[PagedCase, PagedCase, LayerScales]:
    """``case`` with FP8 caches, and what they mean: dequantised caches, the query FP8-rounded."""
    device = case.k_cache.device
    scales = LayerScales(*(torch.tensor([s], device=device) for s in SCALES))
    k8, v8 = quantize(case.k_cache, scales.k), quantize(case.v_cache, scales.v)
    stored = dataclasses.replace(case, k_cache=k8, v_cache=v8)
    meant = dataclasses.replace(
        case,
        k_cache=dequantize(k8, scales.k),
        v_cache=dequantize(v8, scales.v),
        q=quantize(case.q).float(),
    )
    return stored, meant, scales


def sinks_for(device: torch.device) -> torch.Tensor:
    """Sink logits big enough to matter next to ~100 keys (FA3 reads them as bf16)."""
    gen = torch.Generator().manual_seed(5)
    sinks = 2.0 * torch.randn(HEADS, generator=gen) + 3.0
    return sinks.to(device, torch.bfloat16 if device.type == "cuda" else torch.float32)


def rel_l2(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double().cpu(), b.double().cpu()
    return ((a - b).norm() / b.norm()).item()


def tolerance(name: str, device: torch.device, fp8: bool) -> float:
    """Relative L2 vs the oracle: fp32 reference 1e-5; bf16 output 1e-2; FA3's FP8 path also
    rounds the softmax probabilities to FP8 before multiplying by V: 4e-2."""
    if device.type == "cpu":
        return 1e-5
    return 4e-2 if name.startswith("fa3") and fp8 else 1e-2  # NOTE: fa3_kernel: FA3 alone


@pytest.mark.parametrize(("fp8", "with_sinks"), OPTIONS, ids=["sinks", "fp8", "fp8+sinks"])
@pytest.mark.parametrize("window", [None, W], ids=["full", "window"])
@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize(("seq_lens", "q_lens"), CASES, ids=["decode", "ragged"])
def test_backends_match_oracle(
    device: torch.device, fp8: bool, with_sinks: bool, window: int | None, page_size: int, seq_lens, q_lens
) -> None:
    case = paged_case(device, page_size, CONTEXT, seq_lens, q_lens)
    stored, meant, scales = fp8_case(case) if fp8 else (case, case, None)
    sinks = sinks_for(device) if with_sinks else None
    expected = oracle(meant, lambda p: 0 if window is None else max(0, p - window), sinks)
    if with_sinks:  # NOTE: the case must show the option: without it the oracle differs
        assert rel_l2(oracle(meant, lambda p: 0 if window is None else max(0, p - window)), expected) > 0.05
    outs = {}
    for name in available_backends(device, dtype=stored.k_cache.dtype):
        backend = select_backend(name, device, dtype=stored.k_cache.dtype)
        call = AttendCall(
            case.q, stored.k_cache, stored.v_cache, case.meta, HEAD_DIM**-0.5, window, None, sinks, scales
        )
        out = backend.forward(call)
        assert out.shape == case.q.shape and out.dtype == case.q.dtype, name
        assert rel_l2(out, expected) <= tolerance(name, device, fp8), name
        outs[name] = out
    if "fa3" in outs:  # NOTE: the kernel against the oracle code on the same inputs
        assert rel_l2(outs["fa3"], outs["reference"]) <= tolerance("fa3", device, fp8)


def test_fp8_cache_without_scales_is_refused() -> None:
    case = paged_case(torch.device("cpu"), 16, CONTEXT, [5, 9], [1, 1])
    stored, _, _ = fp8_case(case)
    backend = select_backend("reference", torch.device("cpu"), dtype=FP8)
    with pytest.raises(ValueError, match="FP8 KV cache is read with its layer's scales"):
        backend.forward(AttendCall(case.q, stored.k_cache, stored.v_cache, case.meta, HEAD_DIM**-0.5))


def test_sinks_of_minus_infinity_are_no_sinks(device: torch.device) -> None:
    """A sink whose exp is 0 changes nothing; the reference equals its sink-less self."""
    case = paged_case(device, 16, CONTEXT, [5, 40, 96], [5, 7, 30])
    backend = select_backend("reference", device)
    call = AttendCall(case.q, case.k_cache, case.v_cache, case.meta, HEAD_DIM**-0.5)
    plain = backend.forward(call)
    none = torch.full((HEADS,), float("-inf"), device=device)
    sunk = backend.forward(dataclasses.replace(call, sinks=none))
    assert torch.equal(plain, sunk)


@pytest.mark.parametrize(
    ("sinks", "match"),
    [
        (torch.zeros(HEADS), "bfloat16, got torch.float32"),
        (torch.zeros(HEADS + 1, dtype=torch.bfloat16), rf"contiguous \[{HEADS}\], got \[{HEADS + 1}\]"),
        (torch.zeros(2 * HEADS, dtype=torch.bfloat16)[::2], "contiguous"),
    ],
)
def test_fa3_refuses_sinks_it_would_misread(sinks: torch.Tensor, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        check_sinks(sinks, HEADS)
    with pytest.raises(ValueError, match="at most 64 sinks per rank, got 65"):
        check_sinks(torch.zeros(65, dtype=torch.bfloat16), 65)
