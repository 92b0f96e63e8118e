"""The skinny GEMM with a float32 weight and a 16-bit ``x`` (a float32 router, ``moe.Gate``).

The oracle is ``F.linear(x.float(), W, b)``: widening bf16/fp16 to float32 is exact and the
kernel multiplies and sums in fp32 (``M > 1``: ``tl.dot`` in IEEE fp32, no TF32), so the two
differ only by the summation order: at most :data:`REL` of ``|x| @ |W|^T``, the sum of the
products' magnitudes (K fp32 additions in another order). Runs on the GPU (``-m gpu``) and on the
CPU under Triton's interpreter (``TRITON_INTERPRET=1``, rerun in a child process by the last test).
"""

from __future__ import annotations

import pytest
import torch
from torch.nn import functional as F

from graphrt.kernels import invariant, prologue
from graphrt.kernels import skinny as sk
from graphrt.kernels.switches import batch_invariant
from graphrt.models import ops
from graphrt.models.moe import Gate
from tests.support.triton_util import (
    INTERPRET,
    NO_SPILLS,
    ptxas_report,
    rerun_marks,
    rerun_under_interpreter,
    sm90_ptx,
    triton_devices,
)

#: Summation-order tolerance relative to ``|x| @ |W|^T`` (fp32: 2**-24 per addition, ~sqrt(K) of them).
REL = 1e-5
#: Router shapes ``(E, H)``: Mixtral, OLMoE / DeepSeek-V2-Lite, Qwen3-30B-A3B, gpt-oss-20b,
#: DeepSeek-V2, DeepSeek-V3.
ROUTERS = [(8, 4096), (64, 2048), (128, 2048), (32, 2880), (160, 5120), (256, 7168)]


def _inputs(device, m: int, n: int, k: int, bias: bool, dtype=torch.bfloat16):
    gen = torch.Generator().manual_seed(m * 1000 + n + k)
    x = torch.randn(m, k, generator=gen).to(device, dtype)
    w = (torch.randn(n, k, generator=gen) * k**-0.5).to(device)
    b = torch.randn(n, generator=gen).to(device) if bias else None
    return x, w, b


def _assert_exact(got: torch.Tensor, x, w, b, topk: int = 4) -> None:
    """``got`` is ``F.linear(x.float(), w, b)`` up to the summation order; each row's top-k agree."""
    assert got.dtype == torch.float32 and got.shape == (x.shape[0], w.shape[0]) and got.is_contiguous()
    want = F.linear(x.float(), w, b)
    scale = F.linear(x.float().abs(), w.abs()) + (0 if b is None else b.abs())
    assert ((got - want).abs() <= REL * scale).all(), f"max diff {(got - want).abs().max().item():.3g}"
    k = min(topk, w.shape[0])
    assert torch.equal(got.topk(k).indices, want.topk(k).indices), "the router's top-k changed"


@pytest.fixture
def kernel_on(monkeypatch: pytest.MonkeyPatch, device: torch.device) -> None:
    if device.type == "cpu":
        monkeypatch.setenv(sk.ENV, "interpret")


@pytest.mark.parametrize("device", triton_devices())
@pytest.mark.parametrize("m", [1, 2, 5, 16, 64])
@pytest.mark.parametrize(("n", "k"), [(64, 2048), (75, 200)])
@pytest.mark.parametrize("bias", [False, True], ids=["nobias", "bias"])
def test_fp32_weight_is_float_linear(device, kernel_on, m, n, k, bias) -> None:
    """Default tiles: the GEMV (``M == 1``) and the fp32 ``tl.dot`` (``M > 1``), ragged N and K."""
    x, w, b = _inputs(device, m, n, k, bias)
    _assert_exact(sk.skinny_linear(x, w, b), x, w, b)


@pytest.mark.parametrize("device", triton_devices())
@pytest.mark.parametrize(
    ("m", "tile"),
    [(1, sk.Tile(2, 32, warps=1)), (1, sk.Tile(8, 64, stages=3)), (3, sk.Tile(16, 32, warps=2)),
     (16, sk.Tile(16, 32, stages=4)), (64, sk.Tile(32, 64))],
)  # fmt: skip
def test_fp32_weight_small_tiles_and_fp16_x(device, kernel_on, m, tile) -> None:
    """Several K steps with a ragged last tile (N = 75, K = 200); ``x`` in fp16 too."""
    for dtype in (torch.bfloat16, torch.float16):
        x, w, b = _inputs(device, m, 75, 200, bias=True, dtype=dtype)
        _assert_exact(sk.skinny_linear(x, w, b, tile=tile), x, w, b)


@pytest.mark.parametrize("device", triton_devices())
def test_fp32_weight_batch_invariant(device, kernel_on) -> None:
    """``invariant_linear`` takes it too: each row has the same bits alone and in a batch."""
    x, w, b = _inputs(device, 40, 64, 256, bias=True)
    whole = invariant.invariant_linear(x, w, b)
    _assert_exact(whole, x, w, b)
    for m in (1, 17):
        assert torch.equal(invariant.invariant_linear(x[:m], w, b), whole[:m]), f"M={m} differs from M=40"


@pytest.mark.parametrize("device", triton_devices())
def test_ops_linear_and_gate_take_the_kernel_for_one_row(device, kernel_on, monkeypatch) -> None:
    calls = []
    kernel = sk.skinny_linear
    monkeypatch.setattr(sk, "skinny_linear", lambda *a, **kw: calls.append(a[1].dtype) or kernel(*a, **kw))
    gate = Gate(256, 64, bias=False, fp32=True).to(device, torch.bfloat16)
    assert gate.weight.dtype == torch.float32
    x, _, _ = _inputs(device, 3, 64, 256, bias=False)
    _assert_exact(gate(x[:1]), x[:1], gate.weight, None)
    assert calls == [torch.float32]
    assert torch.equal(gate(x), F.linear(x.float(), gate.weight)) and len(calls) == 1  # NOTE: 3 rows: torch
    with batch_invariant(True):
        _assert_exact(gate(x), x, gate.weight, None)  # NOTE: the batch-invariant kernel
    plain = Gate(256, 64, bias=True, fp32=False).to(device, torch.bfloat16)
    got = plain(x[:1])
    assert got.dtype == torch.bfloat16 and calls == [torch.float32, torch.bfloat16]
    torch.testing.assert_close(got, F.linear(x[:1], plain.weight, plain.bias), rtol=2**-6, atol=1e-4)


def test_on_the_cpu_gate_is_float_linear_bit_for_bit() -> None:
    """Without the kernel (the CPU's default) ``ops.linear`` widens ``x`` for a float32 weight."""
    x, w, b = _inputs(torch.device("cpu"), 5, 64, 96, bias=True)
    assert not sk.enabled(x.device)
    assert torch.equal(ops.linear(x, w, b), F.linear(x.float(), w, b))
    gate = Gate(96, 64, bias=True, fp32=True).bfloat16()
    assert torch.equal(gate(x), F.linear(x.float(), gate.weight, gate.bias))
    assert torch.equal(gate(x.float()), F.linear(x.float(), gate.weight, gate.bias))
    plain = Gate(96, 64, bias=False, fp32=False).bfloat16()
    assert torch.equal(plain(x), F.linear(x, plain.weight))


@pytest.mark.parametrize(
    ("dtypes", "match"),
    [
        ((torch.float32, torch.float32, None), r"x one of \(torch.bfloat16, torch.float16\)"),
        ((torch.bfloat16, torch.float16, None), "weight and bias in x's dtype or both torch.float32"),
        (
            (torch.bfloat16, torch.float32, torch.bfloat16),
            r"\(torch.bfloat16, torch.float32, torch.bfloat16\)",
        ),
        ((torch.float16, torch.bfloat16, torch.bfloat16), "weight and bias in x's dtype or both"),
    ],
)
def test_refuses_other_dtype_mixes_naming_them(dtypes, match) -> None:
    x, w = torch.zeros(2, 64, dtype=dtypes[0]), torch.zeros(32, 64, dtype=dtypes[1])
    b = None if dtypes[2] is None else torch.zeros(32, dtype=dtypes[2])
    with pytest.raises(ValueError, match=f"skinny GEMM: dtypes .*{match}"):
        sk.skinny_linear(x, w, b)
    assert not sk.fits(x, w, b) and not invariant.fits(x, w, b)


def test_the_fused_prologues_refuse_a_float32_weight() -> None:
    """Their kernels round to ``x``'s dtype: a float32 weight goes to the norm, then the GEMM."""
    x, w = torch.zeros(1, 64, dtype=torch.bfloat16), torch.zeros(32, 64)
    why = prologue.norm_problem(x, None, torch.ones(64), w)
    assert why is not None and "weight and bias in x's dtype" in why and "float32" in why
    assert prologue.silu_problem(torch.zeros(1, 128, dtype=torch.bfloat16), w) is not None
    assert sk.fits(x, w)


@pytest.mark.parametrize(("n", "k"), ROUTERS)
@pytest.mark.parametrize("m", [1, 2, 16, 64])
def test_router_shapes_have_legal_tiles(n: int, k: int, m: int) -> None:
    """The tuning table's lookups take the routers' shapes (no override: the rule rows)."""
    tile = sk.tile_for(m, n, k)
    assert tile == tile.fit(m, n, k) and tile.block_n <= max(n, 16 if m > 1 else 1)
    if m > 1:
        assert tile.block_n >= 16 and tile.block_k >= 16


@pytest.mark.skipif(sk.triton is None or INTERPRET, reason="needs Triton's compiler")
@pytest.mark.parametrize(("m", "n", "k"), [(1, 64, 2048), (1, 256, 7168), (16, 64, 2048), (64, 64, 2048)])
def test_fp32_weight_compiles_for_hopper_without_spills(m: int, n: int, k: int) -> None:
    """sm_90, no GPU needed: the table's tile for a float32 router weight (twice a bf16 tile's
    bytes) keeps its registers (no spills) and the PDL wait; ``M > 1``: an fp32 FMA ``tl.dot``."""
    tile = sk.tile_for(m, n, k)
    names = sk._skinny.arg_names
    types = {"x": "*bf16", "w": "*fp32", "bias": "*fp32", "y": "*fp32", "M": "i32", "N": "i32", "K": "i32",
             "x_stride": "i32", "w_stride": "i32"}  # fmt: skip
    constexprs = dict(BLOCK_M=sk.block_m(m), BLOCK_N=tile.block_n, BLOCK_K=tile.block_k, HAS_BIAS=False,
                      PDL=True, F32_DOT=True, PIPELINED=tile.stages > 1)  # fmt: skip
    signature = {a: types.get(a, "constexpr") for a in names}
    attrs = {
        (names.index(a),): [["tt.divisibility", 16]] for a in ("x", "w", "y", "K", "x_stride", "w_stride")
    }
    options = {"num_warps": tile.warps, "num_stages": tile.stages}
    ptx = sm90_ptx(sk._skinny, signature, constexprs, options, attrs)
    assert "griddepcontrol.wait" in ptx
    assert NO_SPILLS in ptxas_report(ptx)


@rerun_marks
def test_kernel_under_triton_interpreter() -> None:
    """On a CPU box: this file's kernel cases again, through Triton's interpreter."""
    rerun_under_interpreter(__file__, passed=57)
