"""Skinny GEMM (``graphrt.kernels.skinny``) against torch's ``F.linear``, and ``ops.linear``'s choice.

The kernel runs on the GPU (``-m gpu``) and on the CPU under ``TRITON_INTERPRET=1`` (Triton's
interpreter). The oracle is ``F.linear`` in float32 on the same bf16/fp16 values, rounded once
to the dtype: the kernel also sums fp32 products and rounds once, so the two may differ only
where another summation order crosses a rounding boundary (one unit in the last place; the
interpreter also truncates instead of rounding to nearest).
"""

from __future__ import annotations

import pytest
import torch
from torch.nn import functional as F

from graphrt.kernels import skinny as sk
from graphrt.kernels.tuning import ShapeTile
from graphrt.models import ops
from tests.support.triton_util import (
    INTERPRET,
    NO_SPILLS,
    ptxas_report,
    rerun_marks,
    rerun_under_interpreter,
    sm90_ptx,
    triton_devices,
)
from tests.support.tuning_util import patch_tuning

#: One unit in the last place, relative: bf16 keeps 8 significant bits, fp16 11.
ULP = {torch.bfloat16: 2**-7, torch.float16: 2**-10}
#: Weight shapes of Llama-3.2-1B and Llama-3-8B, ``(N, K)``.
MODEL_SHAPES = [(3072, 2048), (2048, 2048), (16384, 2048), (2048, 8192), (128256, 2048)]
MODEL_SHAPES += [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336)]


def _inputs(device, dtype, m: int, n: int, k: int, bias: bool):
    gen = torch.Generator().manual_seed(m * 1000 + n + k)
    x = torch.randn(m, k, generator=gen).to(device, dtype)
    w = (torch.randn(n, k, generator=gen) * k**-0.5).to(device, dtype)
    b = torch.randn(n, generator=gen).to(device, dtype) if bias else None
    return x, w, b


def _oracle(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    return F.linear(x.float(), w.float(), None if b is None else b.float())


def _assert_matches(got: torch.Tensor, x, w, b) -> None:
    assert got.dtype == x.dtype and got.shape == (x.shape[0], w.shape[0]) and got.is_contiguous()
    want = _oracle(x, w, b)
    # NOTE: fp32 sums of K products in another order differ by ~sqrt(K) ulps near zero.
    near_zero = 1e-5 * max(1.0, (x.shape[1] / 1024) ** 0.5)
    torch.testing.assert_close(got.float(), want, rtol=ULP[x.dtype], atol=near_zero)
    # NOTE: torch's own 16-bit GEMM, one rounding apart; with a bias it rounds the product
    # first, so a sum that cancels may be off by one ulp of the product, not of the sum.
    plain = F.linear(x, w, b).float()
    product = F.linear(x, w).float().abs()
    atol = near_zero if b is None else max(near_zero, float(ULP[x.dtype] * product.max()))
    torch.testing.assert_close(got.float(), plain, rtol=2 * ULP[x.dtype], atol=atol)


@pytest.fixture
def kernel_on(monkeypatch: pytest.MonkeyPatch, device: torch.device) -> None:
    if device.type == "cpu":
        monkeypatch.setenv(sk.ENV, "interpret")


@pytest.mark.parametrize("device", triton_devices())
@pytest.mark.parametrize("m", [1, 3, 16])
@pytest.mark.parametrize(("n", "k"), [(100, 72), (257, 200), (64, 2048)])
@pytest.mark.parametrize("bias", [False, True], ids=["nobias", "bias"])
def test_matches_torch(device, kernel_on, m, n, k, bias) -> None:
    """Default tiles, N and K off every block size, with and without bias."""
    x, w, b = _inputs(device, torch.bfloat16, m, n, k, bias)
    _assert_matches(sk.skinny_linear(x, w, b), x, w, b)


@pytest.mark.parametrize("device", triton_devices())
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize(
    ("m", "tile"),
    [
        (1, sk.Tile(2, 32, warps=1)),
        (1, sk.Tile(16, 64)),
        (5, sk.Tile(16, 32, warps=2)),
        (64, sk.Tile(32, 64)),
        (1, sk.Tile(8, 64, stages=3)),
        (16, sk.Tile(16, 32, stages=4)),
        (64, sk.Tile(32, 64, warps=4, stages=2)),
    ],
)
def test_small_tiles_loop_over_ragged_k(device, kernel_on, dtype, m, tile) -> None:
    """Several K steps with a ragged last tile and a ragged last block of rows (N = 75, K = 200)."""
    x, w, b = _inputs(device, dtype, m, 75, 200, bias=True)
    before = (x.clone(), w.clone(), b.clone())
    _assert_matches(sk.skinny_linear(x, w, b, tile=tile), x, w, b)
    assert all(torch.equal(a, c) for a, c in zip((x, w, b), before, strict=True)), "inputs are read only"


@pytest.mark.parametrize("device", triton_devices())
def test_strided_rows_and_deterministic(device, kernel_on) -> None:
    """``x`` as a column slice of a wider tensor (row stride > K); two calls agree bit for bit."""
    x, w, b = _inputs(device, torch.bfloat16, 4, 96, 160, bias=True)
    wide = torch.zeros(4, 200, dtype=x.dtype, device=device)
    wide[:, 8:168] = x
    got = sk.skinny_linear(wide[:, 8:168], w, b)
    _assert_matches(got, x, w, b)
    assert torch.equal(got, sk.skinny_linear(wide[:, 8:168], w, b))


@pytest.mark.parametrize("device", triton_devices())
def test_ops_linear_uses_the_kernel_up_to_max_rows(device, kernel_on, monkeypatch) -> None:
    calls = []
    kernel = sk.skinny_linear
    monkeypatch.setattr(sk, "skinny_linear", lambda *a, **kw: calls.append(a[0].shape) or kernel(*a, **kw))
    most = ops.SKINNY_MAX_M
    x, w, b = _inputs(device, torch.bfloat16, most + 1, 48, 64, bias=True)
    got = ops.linear(x[:most].view(most, 1, 64), w, b)  # NOTE: leading dims are flattened and restored
    assert calls == [(most, 64)] and got.shape == (most, 1, 48)
    _assert_matches(got.view(most, 48), x[:most], w, b)
    assert torch.equal(ops.linear(x, w, b), F.linear(x, w, b)) and len(calls) == 1  # one row more: torch
    assert ops.linear(x[:0], w, b).shape == (0, 48) and len(calls) == 1  # no rows (IDLE): torch
    monkeypatch.setenv(sk.ENV, "0")
    assert torch.equal(ops.linear(x[:2], w, b), F.linear(x[:2], w, b)) and len(calls) == 1


def test_ops_linear_is_torch_on_the_cpu_by_default() -> None:
    x, w, b = _inputs(torch.device("cpu"), torch.float32, 2, 24, 40, bias=True)
    assert not sk.enabled(x.device)
    assert torch.equal(ops.linear(x, w, b), F.linear(x, w, b))
    xb, wb = x.bfloat16(), w.bfloat16()
    assert torch.equal(ops.linear(xb, wb), F.linear(xb, wb))


@pytest.mark.parametrize(
    ("x", "w", "b", "match"),
    [
        ((0, 64), (32, 64), None, "0 rows; the kernel takes 1..64"),
        ((65, 64), (32, 64), None, "65 rows; the kernel takes 1..64"),
        ((2, 64), (32, 48), None, r"x \(2, 64\) and weight \(32, 48\)"),
        ((2, 64), (32, 64), (31,), "bias has 31 entries for 32 output columns"),
    ],
)
def test_refuses_what_it_cannot_compute(x, w, b, match) -> None:
    make = lambda shape: None if shape is None else torch.zeros(shape, dtype=torch.bfloat16)  # noqa: E731
    with pytest.raises(ValueError, match=match):
        sk.skinny_linear(make(x), make(w), make(b))
    assert not sk.fits(make(x), make(w), make(b))


def test_refuses_mixed_dtypes_and_strided_columns() -> None:
    x, w = torch.zeros(2, 64, dtype=torch.bfloat16), torch.zeros(32, 64, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="weight and bias in x's dtype"):
        sk.check(x.float(), w.float())
    with pytest.raises(ValueError, match="weight and bias in x's dtype"):
        sk.check(x, w.half())
    with pytest.raises(ValueError, match="contiguous last dim"):
        sk.check(x, torch.zeros(64, 32, dtype=torch.bfloat16).t())
    sk.check(x, w)


@pytest.mark.parametrize(("n", "k"), MODEL_SHAPES)
@pytest.mark.parametrize("m", [1, 2, 16, 64])
def test_tiles_of_the_model_shapes(n: int, k: int, m: int) -> None:
    """Every table tile is legal for the path it feeds; one program's tile never exceeds 64 KB."""
    tile = sk.tile_for(m, n, k)
    assert tile == tile.fit(m, n, k)
    if m > 1:
        assert tile.block_n >= 16 and tile.block_k >= 16
    assert tile.block_n * tile.block_k * 2 <= 64 * 1024


def test_overrides_replace_the_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    mine = sk.Tile(block_n=32, block_k=256, warps=8)
    patch_tuning(monkeypatch, skinny_overrides=(ShapeTile(16, 2048, 8192, mine),))
    assert sk.tile_for(3, 2048, 8192) == mine and sk.tile_for(1, 2048, 8192) != mine
    assert sk.tile_for(3, 2048, 4096) != mine
    assert sk.Tile(64, 4096).fit(2, 20, 10) == sk.Tile(32, 16)  # shrunk to N, K; 16 for tl.dot
    with pytest.raises(ValueError, match=r"Tile\.block_k must be a power of two >= 1, got 96"):
        sk.Tile(16, 96)
    with pytest.raises(ValueError, match="at most 64 rows of x, got 65"):
        sk.tile_for(65, 10, 10)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA")
@pytest.mark.parametrize(("n", "k"), MODEL_SHAPES)
@pytest.mark.parametrize("m", [1, 16])
def test_model_shapes_on_the_gpu(n: int, k: int, m: int) -> None:
    """The table's tiles on the real projections (the 8B head: 1 GB, offsets past 2**31 bytes)."""
    x, w, _ = _inputs(torch.device("cuda"), torch.bfloat16, m, n, k, bias=False)
    _assert_matches(sk.skinny_linear(x, w), x, w, None)


def _chain(x: torch.Tensor, weights: list[torch.Tensor], pdl: bool) -> torch.Tensor:
    """Each layer reads the previous one's output: back-to-back PDL launches, and a torch
    kernel (``tanh``, no PDL) between every second pair."""
    for i, w in enumerate(weights):
        x = sk.skinny_linear(x, w, pdl=pdl)
        x = torch.tanh(x) if i % 2 else x
    return x


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA")
@pytest.mark.parametrize("m", [1, 16])
def test_pdl_chain_in_a_graph_matches_eager_bit_for_bit(m: int) -> None:
    """A replay with PDL computes what eager launches without PDL do: every layer waits for the
    previous one's output (a missing or late ``gdc_wait`` reads a stale ``x``)."""
    device = torch.device("cuda")
    gen = torch.Generator(device).manual_seed(m)
    weights = [torch.randn(2048, 2048, device=device, generator=gen).bfloat16() / 45 for _ in range(8)]
    x = torch.zeros(m, 2048, dtype=torch.bfloat16, device=device)
    stream = torch.cuda.Stream(device)
    with torch.cuda.stream(stream):
        _chain(x, weights, pdl=True)  # NOTE: compiles outside the capture
    torch.cuda.synchronize(device)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        out = _chain(x, weights, pdl=True)
    for seed in range(3):
        x.copy_(torch.randn(m, 2048, device=device, generator=gen.manual_seed(100 + seed)))
        graph.replay()
        want = _chain(x, weights, pdl=False)
        torch.cuda.synchronize(device)
        assert torch.equal(out, want), f"replay {seed} differs from eager"
    _assert_matches(sk.skinny_linear(x, weights[0]), x, weights[0], None)


@pytest.mark.skipif(sk.triton is None or INTERPRET, reason="needs Triton's compiler")
@pytest.mark.parametrize(
    ("m", "tile"), [(16, sk.Tile(32, 128, 4, 4)), (64, sk.Tile(64, 128, 4, 3)), (16, sk.Tile(16, 512, 4))]
)
def test_tiles_compile_for_hopper_staged_as_asked(m: int, tile: sk.Tile) -> None:
    """sm_90, no GPU needed: a tile with ``stages > 1`` leaves its W loads to Triton's pipeliner
    (``cp.async`` into shared memory), one with 1 keeps the register prefetch (no ``cp.async``);
    ptxas spills no register either way."""
    names = sk._skinny.arg_names
    types = {"x": "*bf16", "w": "*bf16", "bias": "*bf16", "y": "*bf16", "M": "i32", "N": "i32", "K": "i32",
             "x_stride": "i32", "w_stride": "i32"}  # fmt: skip
    constexprs = dict(BLOCK_M=m, BLOCK_N=tile.block_n, BLOCK_K=tile.block_k, HAS_BIAS=False, PDL=True,
                      F32_DOT=False, PIPELINED=tile.stages > 1)  # fmt: skip
    signature = {a: types.get(a, "constexpr") for a in names}
    attrs = {
        (names.index(a),): [["tt.divisibility", 16]] for a in ("x", "w", "y", "K", "x_stride", "w_stride")
    }
    ptx = sm90_ptx(
        sk._skinny, signature, constexprs, {"num_warps": tile.warps, "num_stages": tile.stages}, attrs
    )
    assert ("cp.async" in ptx) == (tile.stages > 1)
    assert "griddepcontrol.wait" in ptx
    assert NO_SPILLS in ptxas_report(ptx)


@rerun_marks
def test_kernel_under_triton_interpreter() -> None:
    """On a CPU box: this file again, with the kernel run by Triton's interpreter."""
    rerun_under_interpreter(__file__, passed=76)
