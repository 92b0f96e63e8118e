"""Fused-prologue skinny GEMM (``graphrt.kernels.prologue``) against the unfused torch ops.

Runs on the GPU (``-m gpu``) and on the CPU under ``TRITON_INTERPRET=1``. The oracle is the
unfused torch path: :func:`ops.rms_norm_ref` of ``residual + x`` (or :func:`ops.silu_and_mul_ref`
of ``gate_up``), rounded to the dtype as torch rounds it, then ``F.linear`` in float32, rounded
once. The kernel rounds its activation at the same places, so the two may differ only where the
fp32 ``rsqrt(mean(h^2))`` or ``silu`` lands one fp32 ulp apart across a 16-bit rounding boundary
(an identity weight shows the activation itself), plus the GEMM's own summation order.
"""

from __future__ import annotations

import pytest
import torch
from torch.nn import functional as F

from graphrt.capture.emulated import EmulatedEngine
from graphrt.kernels import prologue as pr
from graphrt.kernels import skinny as sk
from graphrt.kernels.switches import triton
from graphrt.models import ops
from tests.support.triton_util import (
    INTERPRET,
    replay_matches_eager,
    rerun_marks,
    rerun_under_interpreter,
    triton_devices,
)

#: One unit in the last place, relative: bf16 keeps 8 significant bits, fp16 11.
ULP = {torch.bfloat16: 2**-7, torch.float16: 2**-10}
EPS = 1e-5


def _inputs(device, dtype, n: int, k: int, bias: bool, seed: int = 0):
    gen = torch.Generator().manual_seed(seed * 7919 + n * 1000 + k)
    x, residual = (torch.randn(1, k, generator=gen).to(device, dtype) for _ in "xr")
    norm_w = (1 + 0.3 * torch.randn(k, generator=gen)).to(device, dtype)
    w = (torch.randn(n, k, generator=gen) * k**-0.5).to(device, dtype)
    b = torch.randn(n, generator=gen).to(device, dtype) if bias else None
    return x, residual, norm_w, w, b


def _oracle(a: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    return F.linear(a.float(), w.float(), None if b is None else b.float())


def _assert_gemm(got: torch.Tensor, a: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> None:
    assert got.dtype == a.dtype and got.shape == (1, w.shape[0]) and got.is_contiguous()
    torch.testing.assert_close(got.float(), _oracle(a, w, b), rtol=ULP[a.dtype], atol=1e-5)


@pytest.fixture
def kernel_on(monkeypatch: pytest.MonkeyPatch, device: torch.device) -> None:
    if device.type == "cpu":
        monkeypatch.setenv(sk.ENV, "interpret")
        monkeypatch.setenv(pr.ENV, "interpret")


#: ``(N, K, tile)``: one tile holding all of K, and several K steps with a ragged last one.
SHAPES = [(75, 200, None), (37, 96, None), (75, 200, sk.Tile(16, 64)), (33, 130, sk.Tile(8, 32, warps=1))]


@pytest.mark.parametrize("device", triton_devices())
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize(("n", "k", "tile"), SHAPES)
@pytest.mark.parametrize("bias", [False, True], ids=["nobias", "bias"])
@pytest.mark.parametrize("add", [False, True], ids=["norm", "add_norm"])
def test_norm_linear_matches_torch(device, kernel_on, dtype, n, k, tile, bias, add) -> None:
    x, residual, norm_w, w, b = _inputs(device, dtype, n, k, bias)
    before = [t.clone() for t in (x, residual, norm_w, w)]
    y, h = pr.norm_linear(x, residual if add else None, norm_w, EPS, w, b, tile=tile)
    assert torch.equal(h, residual + x if add else x), "the new residual is torch's 16-bit sum, bit for bit"
    assert h.data_ptr() not in (x.data_ptr(), residual.data_ptr())
    _assert_gemm(y, ops.rms_norm_ref(h, norm_w, EPS), w, b)
    assert all(torch.equal(t, c) for t, c in zip((x, residual, norm_w, w), before, strict=True))


@pytest.mark.parametrize("device", triton_devices())
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize(("n", "k", "tile"), SHAPES)
@pytest.mark.parametrize("bias", [False, True], ids=["nobias", "bias"])
def test_silu_mul_linear_matches_torch(device, kernel_on, dtype, n, k, tile, bias) -> None:
    _, _, _, w, b = _inputs(device, dtype, n, k, bias)
    gate_up = (2 * torch.randn(1, 2 * k, generator=torch.Generator().manual_seed(k))).to(device, dtype)
    before = gate_up.clone()
    y = pr.silu_mul_linear(gate_up, w, b, tile=tile)
    _assert_gemm(y, ops.silu_and_mul_ref(gate_up), w, b)
    assert torch.equal(gate_up, before)


def _assert_same_rounding(got: torch.Tensor, want: torch.Tensor) -> None:
    """Equal but for a few values one ulp apart (an fp32 ulp of the scale across a boundary)."""
    assert got.dtype == want.dtype and got.shape == want.shape
    torch.testing.assert_close(got.float(), want.float(), rtol=ULP[got.dtype], atol=0.0)
    differ = (got != want).float().mean().item()
    assert differ <= 0.02, f"{differ:.1%} of the activation rounds differently from torch"


@pytest.mark.parametrize("device", triton_devices())
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize(("k", "tile"), [(96, None), (200, sk.Tile(64, 64))])
def test_identity_weight_returns_the_activation(device, kernel_on, dtype, k, tile) -> None:
    """With ``W = I`` the GEMM adds exact zeros: the output is the prologue's rounded activation."""
    x, residual, norm_w, _, _ = _inputs(device, dtype, k, k, bias=False, seed=1)
    eye = torch.eye(k, dtype=dtype, device=device)
    got, h = pr.norm_linear(x, residual, norm_w, EPS, eye, tile=tile)
    _assert_same_rounding(got, ops.rms_norm_ref(h, norm_w, EPS))
    got, _ = pr.norm_linear(x, None, norm_w, EPS, eye, tile=tile)
    _assert_same_rounding(got, ops.rms_norm_ref(x, norm_w, EPS))
    gate_up = (3 * torch.randn(1, 2 * k, generator=torch.Generator().manual_seed(2))).to(device, dtype)
    _assert_same_rounding(pr.silu_mul_linear(gate_up, eye, tile=tile), ops.silu_and_mul_ref(gate_up))


@pytest.mark.parametrize("device", triton_devices())
def test_ops_fuse_single_rows_only(device, kernel_on, monkeypatch) -> None:
    """``ops.add_norm_linear`` / ``ops.silu_mul_linear`` launch the fused kernel for one row;
    two rows, or the switch at 0, run the unfused ops (equal to composing them by hand)."""
    calls: list[str] = []
    for name in ("norm_linear", "silu_mul_linear"):
        kernel = getattr(pr, name)
        monkeypatch.setattr(pr, name, lambda *a, _k=kernel, _n=name, **kw: calls.append(_n) or _k(*a, **kw))
    x, residual, norm_w, w, b = _inputs(device, torch.bfloat16, 48, 64, bias=True)
    y, h = ops.add_norm_linear(x, residual.clone(), norm_w, EPS, w, b)
    gate_up = torch.cat((x[:, :32], residual[:, :32]), -1)
    ops.silu_mul_linear(gate_up, w[:, :32], b)  # NOTE: W's rows 64 apart: a strided weight
    assert calls == ["norm_linear", "silu_mul_linear"]
    _assert_gemm(y, ops.rms_norm_ref(h, norm_w, EPS), w, b)

    def unfused(x2: torch.Tensor, r2: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        normed, stream = ops.add_rms_norm(x2.clone(), r2.clone(), norm_w, EPS)
        return ops.linear(normed, w, b), stream

    two, two_res = torch.cat((x, residual)), torch.cat((residual, x))
    got = ops.add_norm_linear(two.clone(), two_res.clone(), norm_w, EPS, w, b)
    assert all(torch.equal(g, u) for g, u in zip(got, unfused(two, two_res), strict=True))
    twice = torch.cat((gate_up, gate_up))
    assert torch.equal(ops.silu_mul_linear(twice, w[:, :32]), ops.linear(ops.silu_and_mul(twice), w[:, :32]))
    monkeypatch.setenv(pr.ENV, "0")
    # NOTE: clones: on the GPU the unfused add + norm writes x and residual in place
    off = ops.add_norm_linear(x.clone(), residual.clone(), norm_w, EPS, w, b)
    assert all(torch.equal(g, u) for g, u in zip(off, unfused(x, residual), strict=True))
    assert len(calls) == 2


@pytest.mark.skipif(not INTERPRET or triton is None, reason="needs Triton's interpreter")
def test_emulated_capture_records_one_op_per_launch(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each fused launch is one ``torch.ops.graphrt`` op: the emulated engine records it (under
    the kernel's name) and its replay recomputes from the inputs' new values."""
    device = torch.device("cpu")
    monkeypatch.setenv(sk.ENV, "interpret")
    monkeypatch.setenv(pr.ENV, "interpret")
    x, residual, norm_w, w, b = _inputs(device, torch.bfloat16, 48, 64, bias=True)
    gate_up = torch.randn(1, 128, generator=torch.Generator().manual_seed(3)).to(device, torch.bfloat16)

    def step() -> tuple[torch.Tensor, ...]:
        return (*pr.norm_linear(x, residual, norm_w, EPS, w, b), pr.silu_mul_linear(gate_up, w))

    graph, out = EmulatedEngine().capture("prologue", step, warmup=1)
    fused = {k.name: k.count for k in graph.info.kernels if k.name.startswith("prologue")}
    assert fused == {"prologue_norm_gemm": 1, "prologue_silu_gemm": 1}
    for t in (x, residual, gate_up):
        t.copy_(torch.randn(t.shape, generator=torch.Generator().manual_seed(t.shape[1])))
    graph.replay()
    assert all(torch.equal(o, e) for o, e in zip(out, step(), strict=True))


def test_unfused_on_the_cpu_by_default() -> None:
    x, residual, norm_w, w, b = _inputs(torch.device("cpu"), torch.bfloat16, 24, 40, bias=True)
    assert not pr.enabled(x.device)
    y, h = ops.add_norm_linear(x, None, norm_w, EPS, w, b)
    assert h is x and torch.equal(y, F.linear(ops.rms_norm_ref(x, norm_w, EPS), w, b))
    gate_up = torch.cat((x, residual), -1)
    assert torch.equal(
        ops.silu_mul_linear(gate_up, w[:, :40]), F.linear(ops.silu_and_mul_ref(gate_up), w[:, :40])
    )


def _bf16(*shape: int) -> torch.Tensor:
    return torch.zeros(shape, dtype=torch.bfloat16)


@pytest.mark.parametrize(
    ("x", "residual", "norm_w", "w", "match"),
    [
        ((2, 64), None, (64,), (32, 64), r"x \(2, 64\) is not one row \[1, K\]"),
        ((1, 64), (1, 48), (64,), (32, 64), r"residual \(1, 48\) torch.bfloat16 is not x's \(1, 64\)"),
        ((1, 64), None, (63,), (32, 64), r"norm weight \(63,\) is not a contiguous float vector of 64"),
        ((1, 64), None, (64,), (32, 60), r"x \(1, 64\) and weight \(32, 60\) are not \[M, K\] and \[N, K\]"),
    ],
)
def test_norm_linear_refuses_what_it_cannot_compute(x, residual, norm_w, w, match) -> None:
    args = (_bf16(*x), None if residual is None else _bf16(*residual), _bf16(*norm_w), EPS, _bf16(*w))
    with pytest.raises(ValueError, match="fused norm \\+ GEMM: " + match):
        pr.norm_linear(*args)
    assert pr.norm_problem(*args[:3], args[4]) is not None


@pytest.mark.parametrize(
    ("gate_up", "w", "b", "match"),
    [
        ((1, 100), (32, 64), None, r"gate_up \(1, 100\) is not \[1, 2 K\] for weight \(32, 64\) \[N, K\]"),
        ((3, 128), (32, 64), None, r"x \(3, 128\) is not one row"),
        ((1, 128), (32, 64), (31,), "bias has 31 entries for 32 output columns"),
    ],
)
def test_silu_mul_linear_refuses_what_it_cannot_compute(gate_up, w, b, match) -> None:
    args = (_bf16(*gate_up), _bf16(*w), None if b is None else _bf16(*b))
    with pytest.raises(ValueError, match="fused SiLU-and-mul \\+ GEMM: " + match):
        pr.silu_mul_linear(*args)
    assert pr.silu_problem(*args) is not None


#: ``(N, K)`` of Llama-3.2-1B / Llama-3-8B projections after a norm (qkv, gate_up, the tied head:
#: offsets past 2**31 bytes) and of the down projections (K = intermediate).
NORMED_SHAPES = [(3072, 2048), (16384, 2048), (128256, 2048), (6144, 4096), (28672, 4096)]
DOWN_SHAPES = [(2048, 8192), (4096, 14336), (576, 1536)]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA")
@pytest.mark.parametrize(("n", "k"), NORMED_SHAPES + DOWN_SHAPES)
def test_model_shapes_on_the_gpu(n: int, k: int) -> None:
    """The table's tiles on the real projections: one K tile up to 2048, several above."""
    x, residual, norm_w, w, _ = _inputs(torch.device("cuda"), torch.bfloat16, n, k, bias=False)
    if (n, k) in NORMED_SHAPES:
        y, h = pr.norm_linear(x, residual, norm_w, EPS, w)
        assert torch.equal(h, residual + x)
        _assert_gemm(y, ops.rms_norm_ref(h, norm_w, EPS), w, None)
    else:
        gate_up = 2 * torch.cat((x, residual), -1)
        _assert_gemm(pr.silu_mul_linear(gate_up, w), ops.silu_and_mul_ref(gate_up), w, None)


def _blocks(x: torch.Tensor, layers: list[tuple[torch.Tensor, ...]], pdl: bool) -> tuple[torch.Tensor, ...]:
    """SmolLM2-shaped blocks without attention (o reads a slice of qkv): every launch reads the
    previous one's output, and every norm the residual another launch wrote."""
    residual = None
    for qkv, o, gate_up, down, norm1, norm2 in layers:
        y, residual = pr.norm_linear(x, residual, norm1, EPS, qkv, pdl=pdl)
        x = sk.skinny_linear(y[:, : o.shape[1]], o, pdl=pdl)
        y, residual = pr.norm_linear(x, residual, norm2, EPS, gate_up, pdl=pdl)
        x = pr.silu_mul_linear(y, down, pdl=pdl)
    return x, residual


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA")
def test_pdl_blocks_in_a_graph_match_eager_bit_for_bit() -> None:
    """A replay with PDL computes what eager launches without PDL do: a fused launch that read x
    or the residual before its producer finished (or raced program 0's write) would differ."""
    device, h, inner = torch.device("cuda"), 576, 1536
    gen = torch.Generator(device).manual_seed(0)
    rand = lambda *shape: (torch.randn(*shape, device=device, generator=gen) * shape[-1] ** -0.5).bfloat16()  # noqa: E731
    layers = [(rand(960, h), rand(h, h), rand(2 * inner, h), rand(h, inner), 1 + rand(h), 1 + rand(h)) for _ in range(8)]  # fmt: skip
    x = torch.zeros(1, h, dtype=torch.bfloat16, device=device)
    replay_matches_eager(lambda pdl: _blocks(x, layers, pdl=pdl), x)


@rerun_marks
def test_kernel_under_triton_interpreter() -> None:
    """On a CPU box: this file again, with the kernels run by Triton's interpreter."""
    rerun_under_interpreter(__file__, passed=62)
