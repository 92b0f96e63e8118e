"""The qkv projection with RoPE and the KV store in its epilogue (``qkv_rope_gemm``,
``GRAPHRT_QKV_ROPE``) against the two launches it replaces: ``prologue_norm_gemm`` (the fused
norm GEMM) then ``rope_store``.

Kernel cases run on the GPU (``-m gpu``) and on the CPU under ``TRITON_INTERPRET=1`` (small
hidden sizes; a CPU box with Triton reruns this file so, last test). Each case: the head
geometry of Llama-3.2-1B (32/8 heads, D 64), SmolLM2 (9/3, D 64) or the 8B (32/8, D 128), with
and without the residual add and the qkv bias, one K tile and several; the slot a real token's
or the dummy slot 0 a pad row writes. Checked bit for bit: q, the new residual stream and both
caches (every other slot untouched). Also: the sm_90 build's registers (no spills), and bad
input refused by name with nothing written.
"""

from __future__ import annotations

import pytest
import torch

from graphrt.attention.kv_slot import KVSlot
from graphrt.kv import rope_store as rs
from graphrt.models import prologue as pr
from graphrt.models import qkv_rope as qr
from graphrt.models import skinny as sk
from graphrt.models.ops import rope_cos_sin
from graphrt.models.rope import default_inv_freq
from graphrt.step.switches import triton
from tests.triton_util import INTERPRET, rerun_marks, rerun_under_interpreter, triton_devices

EPS = 1e-5
#: (query heads, KV heads, head dim, hidden size on the GPU): Llama-3.2-1B, SmolLM2-135M, Llama-3-8B.
SHAPES = {"1b": (32, 8, 64, 2048), "smollm2": (9, 3, 64, 576), "8b": (32, 8, 128, 4096)}
#: The interpreter's hidden sizes: one tile, and (with a 64-wide tile) several, the last ragged.
CPU_HIDDEN = {64: 96, 128: 160}
#: The interpreter runs a program at a time (ms each): 1B's and 8B's GQA (4:1) with fewer heads.
CPU_HEADS = {"1b": (8, 2), "smollm2": (9, 3), "8b": (4, 1)}


@pytest.fixture
def kernels_on(monkeypatch: pytest.MonkeyPatch, device: torch.device) -> None:
    if device.type == "cpu":
        for env in (sk.ENV, pr.ENV, rs.ENV, qr.ENV):
            monkeypatch.setenv(env, "interpret")


def geometry(device: torch.device, name: str) -> tuple[int, int, int, int]:
    """(query heads, KV heads, head dim, hidden size) of shape ``name`` on ``device``."""
    heads, hk, d, hidden = SHAPES[name]
    return (heads, hk, d, hidden) if device.type == "cuda" else (*CPU_HEADS[name], d, CPU_HIDDEN[d])


def make_case(device, shape, dtype, bias: bool, page: int, seed: int = 0):
    """One token's inputs (x, residual, norm weight, W, bias, cos_sin) and random caches."""
    heads, hk, d, hidden = shape
    gen = torch.Generator().manual_seed(seed)
    x, residual = (torch.randn(1, hidden, generator=gen).to(device, dtype) for _ in "xr")
    norm_w = (1 + 0.3 * torch.randn(hidden, generator=gen)).to(device, dtype)
    w = (torch.randn((heads + 2 * hk) * d, hidden, generator=gen) * hidden**-0.5).to(device, dtype)
    b = torch.randn(w.shape[0], generator=gen).to(device, dtype) if bias else None
    position = torch.tensor([77 + seed], device=device)
    cos_sin = rope_cos_sin(position, default_inv_freq(500000.0, d).to(device), dtype)
    cache = (5, page, hk, d)
    kc, vc = (torch.randn(cache, generator=gen).to(device, dtype) for _ in "kv")
    return x, residual, norm_w, w, b, cos_sin, kc, vc


def unfused(case, heads: int, add: bool, loc: torch.Tensor):
    """``prologue_norm_gemm`` then ``rope_store`` on copies of the caches: (q, h, k cache, v cache)."""
    x, residual, norm_w, w, b, cos_sin, kc, vc = case
    kc, vc = kc.clone(), vc.clone()
    y, h = pr.norm_linear(x, residual if add else None, norm_w, EPS, w, b)
    d, hk = kc.shape[-1], kc.shape[-2]
    q, k, v = y.split((heads * d, hk * d, hk * d), dim=-1)
    q = rs.rope_store(q.view(1, heads, d), k.view(1, hk, d), v.view(1, hk, d), cos_sin, kc, vc, loc)
    return q, h, kc, vc


def fused(case, heads: int, add: bool, loc: torch.Tensor):
    """:func:`qkv_rope.norm_qkv_rope` on copies of the caches: (q, h, k cache, v cache)."""
    x, residual, norm_w, w, b, cos_sin, kc, vc = case
    slot = KVSlot(0, kc.clone(), vc.clone(), loc)
    q, h = qr.norm_qkv_rope(x, residual if add else None, norm_w, EPS, w, b, cos_sin, heads, slot)
    return q, h, slot.k_cache, slot.v_cache


@pytest.mark.parametrize("device", triton_devices())
@pytest.mark.parametrize("name", list(SHAPES))
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize(("add", "bias"), [(True, False), (False, True)], ids=["add", "first_bias"])
def test_epilogue_matches_norm_gemm_then_rope_store(device, kernels_on, name, dtype, add, bias, monkeypatch):
    if device.type == "cpu" and dtype == torch.float16 and name != "smollm2":
        pytest.skip("the interpreter runs fp16 on one shape (it is slow)")
    shape = geometry(device, name)
    heads, hk, d, hidden = shape
    for page, split_k, slot in ((16, False, 37), (1, True, 0)):  # NOTE: slot 0: a pad row's dummy slot
        if split_k:  # NOTE: several K tiles (a ragged last one), both kernels: the tile is the shape's
            monkeypatch.setitem(pr.TILES, ((heads + 2 * hk) * d, hidden), sk.Tile(8, 64))
        case = make_case(device, shape, dtype, bias, page, seed=slot)
        loc = torch.tensor([slot], device=device)
        want, got = unfused(case, heads, add, loc), fused(case, heads, add, loc)
        for name, a, b in zip(("q", "h", "k cache", "v cache"), got, want, strict=True):
            assert a.shape == b.shape and a.dtype == b.dtype, name
            assert torch.equal(a, b), f"{name} differs (page {page}, slot {slot})"
        kc, vc = case[6].flatten(0, 1), case[7].flatten(0, 1)
        others = torch.arange(kc.shape[0], device=device) != slot
        assert torch.equal(got[2].flatten(0, 1)[others], kc[others]), "another k slot was written"
        assert torch.equal(got[3].flatten(0, 1)[others], vc[others]), "another v slot was written"
        assert not torch.equal(got[2].flatten(0, 1)[slot], kc[slot]), "the slot was not written"


@pytest.mark.parametrize("device", triton_devices())
def test_bad_input_is_refused_by_name_and_nothing_written(device, kernels_on) -> None:
    case = make_case(device, geometry(device, "smollm2"), torch.bfloat16, False, 16)
    x, residual, norm_w, w, b, cos_sin, kc, vc = case
    before = (kc.clone(), vc.clone())
    loc = torch.tensor([3], device=device)
    bad = {
        "weight": dict(heads=8),  # NOTE: 8 + 2 x 3 heads are not W's 15 x 64 rows
        "cos_sin": dict(cos_sin=cos_sin[:, :32]),
        "caches": dict(v_cache=vc.float()),
        "loc": dict(loc=torch.tensor([3, 4], device=device)),
        "one row": dict(x=x.expand(2, -1), residual=None),
    }
    for needle, change in bad.items():
        args = dict(x=x, residual=residual, heads=9, cos_sin=cos_sin, v_cache=vc, loc=loc) | change
        slot = KVSlot(0, kc, args["v_cache"], args["loc"])
        with pytest.raises(ValueError, match=needle):
            qr.norm_qkv_rope(
                args["x"], args["residual"], norm_w, EPS, w, b, args["cos_sin"], args["heads"], slot
            )
    assert torch.equal(kc, before[0]) and torch.equal(vc, before[1])


@pytest.mark.gpu
@pytest.mark.skipif(not (torch.cuda.is_available() and triton is not None), reason="no CUDA / Triton")
def test_graph_replay_with_pdl_reads_new_input_angles_and_slot() -> None:
    """Captured once after a skinny GEMM (its output is ``x``), both with PDL; then ``x``'s input,
    the angles and the slot rewritten in place (a new step): each replay writes the new slot and
    equals eager launches without PDL and the two unfused launches, bit for bit."""
    device = torch.device("cuda")
    shape = geometry(device, "1b")
    heads, hidden = shape[0], shape[3]
    _, residual, norm_w, w, b, cos_sin, kc, vc = make_case(device, shape, torch.bfloat16, False, 16)
    gen = torch.Generator(device).manual_seed(5)
    w_prev = (torch.randn(hidden, hidden, device=device, generator=gen) * hidden**-0.5).bfloat16()
    src, loc = (
        torch.randn(1, hidden, device=device, generator=gen).bfloat16(),
        torch.tensor([5], device=device),
    )
    slot = KVSlot(0, kc, vc, loc)

    def run(pdl: bool) -> tuple[torch.Tensor, ...]:
        x = sk.skinny_linear(src, w_prev, pdl=pdl)  # NOTE: the kernel before it, as a layer's o-proj
        return (x, *qr.norm_qkv_rope(x, residual, norm_w, EPS, w, b, cos_sin, heads, slot, pdl=pdl))

    run(True)  # NOTE: compiles outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = run(True)
    for seed, new_slot in enumerate((9, 0, 63)):
        new = make_case(device, shape, torch.bfloat16, False, 16, seed=seed + 1)
        src.copy_(torch.randn(1, hidden, device=device, generator=gen).bfloat16())
        cos_sin.copy_(new[5])
        loc.fill_(new_slot)
        before = (kc.clone(), vc.clone())
        graph.replay()
        replayed = (*(t.clone() for t in out), kc.clone(), vc.clone())
        kc.copy_(before[0])
        vc.copy_(before[1])
        x, q, h = run(False)
        assert all(torch.equal(a, b) for a, b in zip(replayed, (x, q, h, kc, vc), strict=True)), seed
        want_q, want_h, want_k, want_v = unfused(
            (x, residual, norm_w, w, b, cos_sin, *before), heads, True, loc
        )
        assert torch.equal(q, want_q) and torch.equal(h, want_h), seed
        assert torch.equal(kc, want_k) and torch.equal(vc, want_v), seed
        assert not torch.equal(kc.flatten(0, 1)[new_slot], before[0].flatten(0, 1)[new_slot])


def test_switch_is_off_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(qr.ENV, raising=False)
    assert not qr.enabled(torch.device("cuda")) and not qr.enabled(torch.device("cpu"))
    monkeypatch.setenv(qr.ENV, "1")
    assert not qr.enabled(torch.device("cpu")), "on the CPU only under the interpreter"
    monkeypatch.setenv(qr.ENV, "0")
    assert not qr.enabled(torch.device("cuda"))


@pytest.mark.skipif(
    triton is None or INTERPRET, reason="needs Triton (its bundled ptxas), not its interpreter"
)
@pytest.mark.parametrize(("d", "hidden"), [(64, 2048), (128, 4096)])
def test_sm90_build_has_no_spills(d: int, hidden: int) -> None:
    """Compiled for sm_90a as the model launches it (bf16, PDL, the add and no bias; ``ONE_TILE``
    up to 2048): ptxas reports no spill stores or loads."""
    from tests.models.qkv_rope_ptx import compile_ptx
    from tests.triton_util import ptxas_report

    report = ptxas_report(compile_ptx(d, hidden))
    assert " 0 bytes spill stores, 0 bytes spill loads" in report, report


@rerun_marks
def test_kernel_under_triton_interpreter() -> None:
    """On a CPU box: this file again, with the kernels run by Triton's interpreter."""
    rerun_under_interpreter(__file__, passed=10)
