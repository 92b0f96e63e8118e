"""The fused add + RMSNorm + GEMM that also hands back the normed row (``norm_keep_linear``).

The kernel against the unfused torch ops (as tests/models/test_prologue.py): the new residual is
torch's 16-bit sum bit for bit; the normed row is ``ops.rms_norm_ref`` of it but for a few values
one ulp apart (an fp32 ulp of ``rsqrt`` across a rounding boundary, as the GEMM input of
``norm_linear``), and exactly the row the GEMM multiplied (an identity weight returns it); the
GEMM is ``F.linear`` of that row to one output ulp (16-bit) or fp32 summation order (a float32
weight, the router's). Inside the models: a single-row DECODE step of a MoE model (the router's
norm) and of MLA (the attention norm in q's first GEMM) launches the op once per such norm and
gives the unfused logits to :data:`TOLERANCE`. On the CPU through Triton's interpreter.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.nn import functional as F

from graphrt import Batch, ForwardMode
from graphrt.kernels import prologue as pr
from graphrt.kernels import skinny as sk
from graphrt.kernels.switches import triton
from graphrt.kernels.tuning import SkinnyRule
from graphrt.models import ops
from graphrt.models.mla import LatentAttention
from graphrt.models.moe import SparseMoE
from tests.support.triton_util import INTERPRET, NO_SPILLS, ptxas_report, sm90_ptx, triton_devices
from tests.support.tuning_util import patch_tuning
from tests.support.util import build_runtime, prefill, slot_of

ULP = {torch.bfloat16: 2**-7, torch.float16: 2**-10}
EPS = 1e-5
#: Largest relative difference (max |difference| / max |logit|) of the fused and unfused logits
#: of a step: the same bound as tests/models/test_prologue_model.py (one bf16 ulp of a norm here
#: and there, carried on by later layers).
TOLERANCE = 2**-5
SHAPES = [(75, 200, None), (33, 130, sk.Tile(8, 32, warps=1))]


@pytest.fixture
def kernel_on(monkeypatch: pytest.MonkeyPatch, device: torch.device) -> str:
    on = "interpret" if device.type == "cpu" else "1"
    monkeypatch.setenv(sk.ENV, on)
    monkeypatch.setenv(pr.ENV, on)
    return on


def _inputs(device, dtype, n: int, k: int, bias: bool, wide: bool):
    gen = torch.Generator().manual_seed(n * 1000 + k)
    x, residual = (torch.randn(1, k, generator=gen).to(device, dtype) for _ in "xr")
    norm_w = (1 + 0.3 * torch.randn(k, generator=gen)).to(device, dtype)
    w_dtype = torch.float32 if wide else dtype
    w = (torch.randn(n, k, generator=gen) * k**-0.5).to(device, w_dtype)
    b = torch.randn(n, generator=gen).to(device, w_dtype) if bias else None
    return x, residual, norm_w, w, b


def _assert_same_rounding(got: torch.Tensor, want: torch.Tensor) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape
    torch.testing.assert_close(got.float(), want.float(), rtol=ULP[got.dtype], atol=0.0)
    assert (got != want).float().mean().item() <= 0.02, "the normed row rounds differently from torch"


def _assert_gemm(y: torch.Tensor, normed: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> None:
    want = F.linear(normed.float(), w.float(), None if b is None else b.float())
    assert y.dtype == sk.out_dtype(normed, w) and y.shape == (1, w.shape[0])
    rtol = 1e-5 if y.dtype == torch.float32 else ULP[y.dtype]
    torch.testing.assert_close(y.float(), want, rtol=rtol, atol=1e-5)


@pytest.mark.parametrize("device", triton_devices())
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize(("n", "k", "tile"), SHAPES)
@pytest.mark.parametrize("wide", [False, True], ids=["w16", "w32"])
@pytest.mark.parametrize("add", [False, True], ids=["norm", "add_norm"])
def test_keep_matches_unfused(device, kernel_on, dtype, n, k, tile, wide, add) -> None:
    x, residual, norm_w, w, b = _inputs(device, dtype, n, k, bias=True, wide=wide)
    before = [t.clone() for t in (x, residual, norm_w, w)]
    y, normed, h = pr.norm_keep_linear(x, residual if add else None, norm_w, EPS, w, b, tile=tile)
    assert torch.equal(h, residual + x if add else x), "the new residual is torch's 16-bit sum, bit for bit"
    assert {h.data_ptr(), normed.data_ptr()}.isdisjoint({x.data_ptr(), residual.data_ptr()})
    _assert_same_rounding(normed, ops.rms_norm_ref(h, norm_w, EPS))
    _assert_gemm(y, normed, w, b)
    if not wide:  # NOTE: the plain kernel takes 16-bit weights only
        plain = pr.norm_linear(x, residual if add else None, norm_w, EPS, w, b, tile=tile)
        assert torch.equal(plain[0], y) and torch.equal(plain[1], h), "keeping the row changes nothing else"
    eye = torch.eye(k, dtype=w.dtype, device=device)
    got, kept, _ = pr.norm_keep_linear(x, residual if add else None, norm_w, EPS, eye, tile=tile)
    assert torch.equal(kept, normed) and torch.equal(got.to(dtype), normed), "the row the GEMM read"
    assert all(torch.equal(t, c) for t, c in zip((x, residual, norm_w, w), before, strict=True))


@pytest.mark.parametrize("device", triton_devices())
def test_op_fuses_single_rows_only(device, kernel_on, monkeypatch) -> None:
    """``ops.add_norm_linear_keep`` launches the fused kernel for one row (a float32 weight too);
    two rows, or the switch at 0, run the unfused ops and equal composing them by hand."""
    calls: list[torch.dtype] = []
    kernel = pr.norm_keep_linear
    monkeypatch.setattr(pr, "norm_keep_linear", lambda *a, **kw: calls.append(a[4].dtype) or kernel(*a, **kw))
    x, residual, norm_w, w, b = _inputs(device, torch.bfloat16, 24, 64, bias=True, wide=False)
    w32, b32 = w.float(), b.float()
    for weight, bias in ((w, b), (w32, b32)):
        y, normed, h = ops.add_norm_linear_keep(x, residual.clone(), norm_w, EPS, weight, bias)
        assert torch.equal(h, residual + x)
        _assert_gemm(y, normed, weight, bias)
    assert calls == [torch.bfloat16, torch.float32]

    def unfused(x2, r2, weight, bias):  # NOTE: clones: on the GPU the add + norm writes in place
        normed, stream = ops.add_rms_norm(x2.clone(), r2.clone(), norm_w, EPS)
        return ops.linear(normed, weight, bias), normed, stream

    two, two_res = torch.cat((x, residual)), torch.cat((residual, x))
    got = ops.add_norm_linear_keep(two.clone(), two_res.clone(), norm_w, EPS, w32, b32)
    assert all(torch.equal(g, u) for g, u in zip(got, unfused(two, two_res, w32, b32), strict=True))
    monkeypatch.setenv(pr.ENV, "0")
    off = ops.add_norm_linear_keep(x.clone(), residual.clone(), norm_w, EPS, w, b)
    assert all(torch.equal(g, u) for g, u in zip(off, unfused(x, residual, w, b), strict=True))
    first = ops.add_norm_linear_keep(x, None, norm_w, EPS, w, b)
    assert first[2] is x and torch.equal(first[1], ops.rms_norm(x, norm_w, EPS))
    assert len(calls) == 2


def _decode(setup, token: int, seq_len: int) -> Batch:
    return Batch.create(
        ForwardMode.DECODE, input_ids=[token], seq_lens=[seq_len], req_pool_indices=[0],
        out_cache_loc=[slot_of(setup, 0, seq_len - 1)],
    )  # fmt: skip


def _fused_norms(model: torch.nn.Module) -> int:
    """The norms that run as ``norm_keep_linear``: each MoE layer's and each dense MLA attention's."""
    moe = sum(isinstance(m, SparseMoE) for m in model.modules())
    mla = sum(isinstance(m, LatentAttention) and m.fuses_norm for m in model.modules())
    return moe + mla


@pytest.mark.parametrize("device", triton_devices())
@pytest.mark.parametrize("model", ["tiny-deepseek-moe", "tiny-qwen3-moe", "tiny-mla", "tiny-deepseek-v3.2"])
def test_decode_step_runs_the_fused_norm(device, kernel_on, model, monkeypatch) -> None:
    """A single-row DECODE step (graphed in debug mode: no buffer it reads keeps its poison;
    eager, the same bits) launches ``norm_keep_linear``
    once per MoE layer and per dense-MLA attention (none for DSA's attention: unfused there) and
    its logits equal the unfused step's within :data:`TOLERANCE`, with the same greedy token."""
    if device.type == "cpu":  # NOTE: interpreted programs are slow: one program per launch
        rule = SkinnyRule(64, 1 << 62, sk.Tile(1024, 512))
        patch_tuning(monkeypatch, skinny_rules=(rule,), prologue_norm_tile=None)
    calls: list[int] = []
    kernel = pr.norm_keep_linear
    monkeypatch.setattr(pr, "norm_keep_linear", lambda *a, **kw: calls.append(1) or kernel(*a, **kw))
    setup = build_runtime(
        device, model=model, dtype=torch.bfloat16, buckets=(1,), max_batch_size=1, max_reqs=1
    )
    expected = _fused_norms(setup.model)
    assert expected > 0
    prefill(setup, [0], [20], np.random.default_rng(0))
    batch = _decode(setup, 7, 21)
    graphed = setup.runtime.run(batch)
    calls.clear()
    eager = setup.runtime.run(batch, eager=True)
    assert torch.equal(graphed, eager), "the replay differs from eager"
    assert len(calls) == expected, calls
    monkeypatch.setenv(pr.ENV, "0")
    unfused = setup.runtime.run(batch, eager=True)
    assert len(calls) == expected, "the switch-off step called the fused kernel"
    peak = ((eager.float() - unfused.float()).abs().max() / unfused.float().abs().max()).item()
    assert peak <= TOLERANCE, f"fused vs unfused logits: relative max {peak:.3g}"
    assert torch.equal(eager.argmax(-1), unfused.argmax(-1))


@pytest.mark.skipif(triton is None or INTERPRET, reason="needs Triton's compiler")
@pytest.mark.parametrize("wide", [False, True], ids=["w16", "w32"])
@pytest.mark.parametrize(("block_k", "one_tile"), [(2048, True), (1024, False)], ids=["one_tile", "k_loop"])
def test_keep_kernel_compiles_for_hopper(wide: bool, block_k: int, one_tile: bool) -> None:
    """The kernel goes through Triton's CUDA compiler for sm_90 with PDL (no GPU needed): it
    waits on the kernel before it once and ptxas spills no register.

    NOTE: at ``BLOCK_K`` 2048 with a K loop (K > 2048) ptxas spills, ``prologue_norm_gemm`` too
    (the loaded-ahead ``W`` tile): not a tile this test pins."""
    from graphrt.kernels import prologue_triton as kernels

    names = ("x", "res", "nw", "w", "bias", "y", "new", "normed", "N", "K", "w_stride", "eps")
    wide_t = "*fp32" if wide else "*bf16"
    types = ("*bf16", "*bf16", "*bf16", wide_t, wide_t, wide_t, "*bf16", "*bf16", "i32", "i32", "i32", "fp32")
    constexprs = dict(
        BLOCK_N=8, BLOCK_K=block_k, ADD=True, HAS_BIAS=True, BF16=True, PDL=True, ONE_TILE=one_tile, WIDE=wide
    )
    signature = {**dict(zip(names, types, strict=True)), **dict.fromkeys(constexprs, "constexpr")}
    ptx = sm90_ptx(kernels.prologue_norm_keep_gemm, signature, constexprs, {"num_warps": 4})
    assert ptx.count("griddepcontrol.wait") == 1
    assert NO_SPILLS in ptxas_report(ptx)
